"""Routes of every server-rendered page. The URL names keep the namespace of the section a page
belongs to (`fleet:`, `telemetry:`, `hypervisors:`, `sizing:`, `notify:`, `alerts:`), so `{% url %}` tags and
bookmarks stay as they were before the pages moved into this app."""

from django.urls import include, path

from dashboard.views import (
    agents,
    alerts,
    audit,
    details,
    drift,
    feedback,
    heatmap,
    hypervisors,
    lists,
    notify,
    operations,
    optimizer,
    overview,
    planner,
    requests,
    scheduler,
    study,
    suggestions,
    workstation,
)

fleet_patterns = [
    path("", overview.overview, name="overview"),
    path("overview/live/", overview.overview_live, name="overview-live"),
    path("me/", workstation.workstation, name="workstation"),
    path("hosts/", lists.HostListView.as_view(), name="host-list"),
    path("hosts/<int:pk>/", details.host_detail, name="host-detail"),
    path("hosts/<int:pk>/hypervisor/check/", hypervisors.host_hypervisor_check, name="host-hypervisor-check"),
    path("hosts/<int:pk>/hypervisor/sync/", hypervisors.host_hypervisor_sync, name="host-hypervisor-sync"),
    path("gpus/", lists.GpuListView.as_view(), name="gpu-list"),
    path("gpus/<int:pk>/", details.gpu_detail, name="gpu-detail"),
    path("vms/", lists.VmListView.as_view(), name="vm-list"),
    path("vms/<int:pk>/", details.vm_detail, name="vm-detail"),
    path("artists/", lists.ArtistListView.as_view(), name="artist-list"),
    path("artists/<int:pk>/", details.artist_detail, name="artist-detail"),
    # --- resize requests ---
    path("requests/", requests.request_list, name="requests"),
    path("requests/<int:pk>/review/", requests.request_review, name="request-review"),
    path("requests/<int:pk>/room/", requests.request_room, name="request-room"),
    path("requests/<int:pk>/<str:verb>/", requests.request_decide, name="request-decide"),
    path("me/vms/<int:vm_pk>/request/", requests.request_file, name="request-file"),
    # --- artists' feedback (the prompt on /me/) ---
    path("me/vms/<int:vm_pk>/feedback/", feedback.feedback_file, name="feedback-file"),
    path("me/feedback/not-now/", feedback.feedback_not_now, name="feedback-not-now"),
    path("notifications/", requests.notification_list, name="notifications"),
    # --- scheduler policies ---
    path("scheduler/", scheduler.scheduler_list, name="scheduler"),
    path("scheduler/gpus/<int:pk>/", scheduler.scheduler_gpu, name="scheduler-gpu"),
    path("scheduler/gpus/<int:pk>/apply/", scheduler.scheduler_gpu_apply, name="scheduler-gpu-apply"),
    path("scheduler/gpus/<int:pk>/box/", scheduler.scheduler_gpu_box, name="scheduler-gpu-box"),
    path("scheduler/gpus/<int:pk>/clear/", scheduler.scheduler_gpu_clear, name="scheduler-gpu-clear"),
    path("scheduler/hosts/<int:pk>/", scheduler.scheduler_host_default, name="scheduler-host"),
    path("scheduler/models/<int:pk>/", scheduler.scheduler_model_default, name="scheduler-model"),
    # --- audit log ---
    path("audit/", audit.AuditListView.as_view(), name="audit"),
]

telemetry_patterns = [
    path("heatmap/", heatmap.heatmap_page, name="heatmap"),
    path("agents/", agents.AgentListView.as_view(), name="agent-list"),
]

sizing_patterns = [
    # --- suggestions ---
    path("suggestions/", suggestions.SuggestionListView.as_view(), name="suggestion-list"),
    path("suggestions/refresh/", suggestions.refresh, name="suggestion-refresh"),
    path("suggestions/<int:pk>/accept/", suggestions.accept, name="suggestion-accept"),
    path("suggestions/<int:pk>/dismiss/", suggestions.dismiss, name="suggestion-dismiss"),
    path("suggestions/<int:pk>/restore/", suggestions.restore, name="suggestion-restore"),
    # --- artists' feedback ---
    path("feedback/", feedback.feedback_trends, name="feedback"),
    # --- density planner ---
    path("planner/", planner.planner_page, name="planner"),
    # --- proof-of-concept study ---
    path("study/", study.study_page, name="study"),
    path("study.csv", study.study_csv, name="study-csv"),
    # --- placement optimizer ---
    path("optimizer/", optimizer.optimizer, name="optimizer"),
    path("optimizer/<int:pk>/", optimizer.optimizer_run, name="optimizer-run"),
    path("optimizer/<int:pk>/apply/", optimizer.apply_plan, name="optimizer-apply"),
    path("optimizer/<int:pk>/run-operations/", optimizer.run_operations, name="optimizer-run-operations"),
]

hypervisors_patterns = [
    path("operations/", operations.OperationListView.as_view(), name="operation-list"),
    path("operations/<int:pk>/", operations.operation_detail, name="operation-detail"),
    path("operations/<int:pk>/run/", operations.operation_run, name="operation-run"),
    path("operations/<int:pk>/cancel/", operations.operation_cancel, name="operation-cancel"),
    path("drift/", drift.drift_list, name="drift"),
]

notify_patterns = [
    path("channels/", notify.ChannelListView.as_view(), name="channel-list"),
    path("channels/new/", notify.channel_create, name="channel-create"),
    path("channels/<int:pk>/", notify.channel_edit, name="channel-edit"),
    path("channels/<int:pk>/test/", notify.channel_test, name="channel-test"),
    path("channels/<int:pk>/delete/", notify.channel_delete, name="channel-delete"),
    path("deliveries/", notify.DeliveryListView.as_view(), name="delivery-list"),
]

alerts_patterns = [
    path("alerts/", alerts.AlertListView.as_view(), name="alert-list"),
    path("alerts/<int:pk>/", alerts.alert_detail, name="alert"),
    path("alerts/<int:pk>/acknowledge/", alerts.alert_acknowledge, name="alert-acknowledge"),
    path("alerts/<int:pk>/silence/", alerts.alert_silence, name="alert-silence"),
    path("alerts/<int:pk>/drain/", alerts.alert_drain, name="alert-drain"),
    path("alerts/rules/", alerts.rule_list, name="rule-list"),
    path("alerts/silences/", alerts.SilenceListView.as_view(), name="silence-list"),
    path("alerts/silences/<int:pk>/end/", alerts.silence_end, name="silence-end"),
    path("licences/", alerts.licences, name="licences"),
    path("versions/", alerts.versions_page, name="versions"),
]

urlpatterns = [
    path("", include((fleet_patterns, "fleet"))),
    path("", include((telemetry_patterns, "telemetry"))),
    path("", include((hypervisors_patterns, "hypervisors"))),
    path("sizing/", include((sizing_patterns, "sizing"))),
    path("alerts/", include((notify_patterns, "notify"))),
    path("", include((alerts_patterns, "alerts"))),
]
