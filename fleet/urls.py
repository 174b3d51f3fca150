"""Routes of the fleet's HTML pages (namespace `fleet`), mounted at the site root."""

from django.urls import path

from fleet.views import audit as audit_views
from fleet.views import details, lists, overview, scheduler, workstation
from fleet.views import requests as request_views

app_name = "fleet"

urlpatterns = [
    path("", overview.overview, name="overview"),
    path("overview/live/", overview.overview_live, name="overview-live"),
    path("me/", workstation.workstation, name="workstation"),
    path("hosts/", lists.HostListView.as_view(), name="host-list"),
    path("hosts/<int:pk>/", details.host_detail, name="host-detail"),
    path("gpus/", lists.GpuListView.as_view(), name="gpu-list"),
    path("gpus/<int:pk>/", details.gpu_detail, name="gpu-detail"),
    path("vms/", lists.VmListView.as_view(), name="vm-list"),
    path("vms/<int:pk>/", details.vm_detail, name="vm-detail"),
    path("artists/", lists.ArtistListView.as_view(), name="artist-list"),
    path("artists/<int:pk>/", details.artist_detail, name="artist-detail"),
    # --- resize requests (fleet/views/requests.py) ---
    path("requests/", request_views.request_list, name="requests"),
    path("requests/<int:pk>/<str:verb>/", request_views.request_decide, name="request-decide"),
    path("me/vms/<int:vm_pk>/request/", request_views.request_file, name="request-file"),
    # --- notifications (fleet/views/requests.py) ---
    path("notifications/", request_views.notification_list, name="notifications"),
    # --- scheduler policies (fleet/views/scheduler.py) ---
    path("scheduler/", scheduler.scheduler_list, name="scheduler"),
    path("scheduler/gpus/<int:pk>/", scheduler.scheduler_gpu, name="scheduler-gpu"),
    path("scheduler/gpus/<int:pk>/apply/", scheduler.scheduler_gpu_apply, name="scheduler-gpu-apply"),
    path("scheduler/gpus/<int:pk>/box/", scheduler.scheduler_gpu_box, name="scheduler-gpu-box"),
    path("scheduler/gpus/<int:pk>/clear/", scheduler.scheduler_gpu_clear, name="scheduler-gpu-clear"),
    path("scheduler/hosts/<int:pk>/", scheduler.scheduler_host_default, name="scheduler-host"),
    path("scheduler/models/<int:pk>/", scheduler.scheduler_model_default, name="scheduler-model"),
    # --- audit log (fleet/views/audit.py) ---
    path("audit/", audit_views.audit_list, name="audit"),
]
