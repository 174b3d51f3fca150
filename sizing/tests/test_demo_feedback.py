"""The demo's artists' ratings (sizing/demo_feedback.py): as their workflows make them feel, the
same on a second run, and in the suggestions' evidence."""

from datetime import date

import pytest
from django.core.management import call_command

from fleet.tests.factories import ArtistFactory, VirtualMachineFactory
from sizing.demo_feedback import seed_feedback, working_days
from sizing.feedback_rules import feedback_summary
from sizing.models import Feedback

pytestmark = pytest.mark.django_db

FRIDAY = date(2026, 11, 27)


def summary(vm) -> dict:
    return feedback_summary(Feedback.objects.filter(vm=vm).values_list("session_date", "rating", "tags"))


def test_animators_have_bad_days_modelers_are_content_and_a_rerun_adds_nothing(capsys):
    animator = VirtualMachineFactory(name="poc-animation", artist=ArtistFactory(name="Amara", workflow="animation"))
    modeler = VirtualMachineFactory(name="poc-modeling", artist=ArtistFactory(name="Mei", workflow="modeling"))
    VirtualMachineFactory(name="render-node", artist=None)  # no artist: nobody to rate it

    assert seed_feedback(FRIDAY) == 20
    assert seed_feedback(FRIDAY) == 0

    assert (working_days(FRIDAY)[0], working_days(FRIDAY)[-1]) == (date(2026, 11, 13), date(2026, 11, 26))
    animation, modeling = summary(animator), summary(modeler)
    assert animation["count"] == modeling["count"] == 10
    assert animation["low_share"] >= 0.3
    assert set(animation["tags"]) <= {"viewport_stutter", "out_of_gpu_memory", "fine"}
    assert (modeling["low_share"], modeling["high_share"]) == (0.0, 1.0)
    call_command("demo_feedback")
    assert "rating(s) written" in capsys.readouterr().out
