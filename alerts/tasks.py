"""Celery tasks of the alerts app (logic in `alerts.evaluate`).

`evaluate_alerts` is beat's entry: one evaluation of every enabled rule over the stored samples,
never in a request. A second one started while the first runs finds the lease taken and returns.
"""

from __future__ import annotations

from celery import shared_task

from alerts.evaluate import evaluate, prune


@shared_task(name="alerts.tasks.evaluate_alerts", ignore_result=True, soft_time_limit=100, time_limit=115)
def evaluate_alerts() -> None:
    evaluate()


@shared_task(name="alerts.tasks.prune_alerts", ignore_result=True, soft_time_limit=240, time_limit=300)
def prune_alerts() -> None:
    prune()
