"""Pages of the sizing app: right-sizing suggestions, the density planner and the optimizer."""

from django.urls import path  # noqa: F401 - each section below adds its paths

from sizing.views import optimizer
from sizing.views import planner as planner_views
from sizing.views import suggestions as suggestion_views

app_name = "sizing"

urlpatterns = [
    # --- suggestions (sizing/views/suggestions.py) ---
    path("suggestions/", suggestion_views.SuggestionListView.as_view(), name="suggestion-list"),
    path("suggestions/refresh/", suggestion_views.refresh, name="suggestion-refresh"),
    path("suggestions/<int:pk>/accept/", suggestion_views.accept, name="suggestion-accept"),
    path("suggestions/<int:pk>/dismiss/", suggestion_views.dismiss, name="suggestion-dismiss"),
    path("suggestions/<int:pk>/restore/", suggestion_views.restore, name="suggestion-restore"),
    # --- density planner (sizing/views/planner.py) ---
    path("planner/", planner_views.planner_page, name="planner"),
    # --- placement optimizer (sizing/views/optimizer.py) ---
    path("optimizer/", optimizer.optimizer, name="optimizer"),
    path("optimizer/<int:pk>/", optimizer.optimizer_run, name="optimizer-run"),
    path("optimizer/<int:pk>/apply/", optimizer.apply_plan, name="optimizer-apply"),
]
