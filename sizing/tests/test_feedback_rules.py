"""The pure rules of artists' feedback: tags that go together, the summary right-sizing reads."""

from __future__ import annotations

from datetime import date

from sizing import feedback_rules
from sizing.feedback_rules import clean_tags, confidence, feedback_summary, tag_errors, week_start, weekly

D = date(2026, 11, 2)  # a Monday


def test_known_tags_alone_or_together_are_fine():
    assert tag_errors([]) == []
    assert tag_errors(["fine"]) == []
    assert tag_errors(["viewport_stutter", "out_of_gpu_memory", "slow_scene_open", "display_lag"]) == []


def test_an_unknown_tag_is_named_with_the_ones_to_choose_from():
    (error,) = tag_errors(["laggy"])
    assert "'laggy'" in error
    assert "viewport_stutter" in error
    assert "fine" in error


def test_fine_with_a_problem_contradicts_itself():
    (error,) = tag_errors(["fine", "display_lag"])
    assert "'fine' cannot go with a problem tag" in error


def test_tags_are_stored_once_each_in_a_fixed_order():
    assert clean_tags(["display_lag", "viewport_stutter", "display_lag"]) == ["viewport_stutter", "display_lag"]


def test_summary_of_no_ratings():
    assert feedback_summary([]) == {"count": 0, "mean": None, "low_share": 0.0, "high_share": 0.0, "tags": {}}


def test_summary_counts_means_and_shares_exactly():
    ratings = [
        (D, 1, ["out_of_gpu_memory", "viewport_stutter"]),
        (D, 2, ["out_of_gpu_memory"]),
        (D, 4, ["fine"]),
        (D, 5, []),
    ]
    assert feedback_summary(ratings) == {
        "count": 4, "mean": 3.0, "low_share": 0.5, "high_share": 0.5,
        "tags": {"out_of_gpu_memory": 0.5, "viewport_stutter": 0.25, "fine": 0.25},
    }


def test_summary_rounds_the_mean_to_two_places_and_counts_a_tag_once_a_rating():
    summary = feedback_summary([(D, 3, ["display_lag", "display_lag"]), (D, 4, []), (D, 4, [])])
    assert summary["mean"] == 3.67
    assert summary["tags"] == {"display_lag": 0.333}


def test_weeks_start_on_monday_and_come_oldest_first():
    assert week_start(date(2026, 11, 8)) == D  # a Sunday
    weeks = weekly([(date(2026, 11, 10), 2, []), (date(2026, 11, 3), 4, []), (date(2026, 11, 4), 5, ["fine"])])
    assert [(w["week"], w["count"], w["mean"]) for w in weeks] == [(D, 2, 4.5), (date(2026, 11, 9), 1, 2.0)]


def test_the_tags_match_the_issue():
    assert feedback_rules.TAGS == ("viewport_stutter", "out_of_gpu_memory", "slow_scene_open", "display_lag", "fine")


# How feedback moves the confidence of the vGPU advice ----------------------------------------------


def days(*ratings: tuple[int, tuple[str, ...]]) -> dict:
    return feedback_summary((date(2026, 3, 2 + i), rating, tags) for i, (rating, tags) in enumerate(ratings))


def test_low_ratings_with_a_short_vgpu_strengthen_an_upsize_and_weaken_a_downsize():
    bad = days((2, ("out_of_gpu_memory",)), (1, ("viewport_stutter",)), (4, ()), (3, ()))
    assert confidence("upsize", bad) == {
        "level": "high", "why": "The artist confirms it: 4 days rated, 50% of them 1-2 stars "
                                "(out of GPU memory 25%, viewport stutter 25%)."}
    assert confidence("downsize", bad)["level"] == "low"
    assert "do not downsize before asking" in confidence("downsize", bad)["why"]


def test_high_ratings_at_low_use_support_a_downsize_and_question_an_upsize():
    good = days((5, ("fine",)), (4, ()), (5, ("fine",)), (4, ()))
    assert confidence("downsize", good)["level"] == "high"
    assert confidence("upsize", good) == {"level": "low", "why": (
        "The artist rates most days well (100% of 4 days rated at 4-5 stars): ask before upsizing.")}


def test_without_feedback_or_in_line_with_the_figures_the_confidence_is_the_figures_alone():
    assert confidence("upsize", days())["level"] == "medium"
    in_line = confidence("keep", days((3, ()), (4, ())))
    assert in_line["why"] == "2 days rated, mean 3.5 stars: in line with the figures."
    assert confidence("keep", days((1, ("display_lag",)), (2, ()), (1, ())))["level"] == "low"
