"""Routes of the v1 sizing API, mounted at /api/v1/."""

from django.urls import path  # noqa: F401 - sections below add their paths

from config.routers import AppRouter
from sizing.api.feedback import FeedbackViewSet
from sizing.api.optimizer import OptimizerRunViewSet
from sizing.api.planner import PlanView, WorkflowPresetViewSet
from sizing.api.suggestions import SuggestionViewSet

router = AppRouter()
# --- suggestions (sizing/api/suggestions.py) ---
router.register("suggestions", SuggestionViewSet, basename="suggestion")
# --- density planner and workflow presets (sizing/api/planner.py) ---
router.register("workflow-presets", WorkflowPresetViewSet, basename="workflowpreset")
# --- placement optimizer (sizing/api/optimizer.py) ---
router.register("optimizer-runs", OptimizerRunViewSet, basename="optimizerrun")

# --- artists' feedback (sizing/api/feedback.py) ---
router.register("feedback", FeedbackViewSet, basename="feedback")

urlpatterns = [
    path("sizing/plan/", PlanView.as_view(), name="sizing-plan"),
    *router.urls,
]
