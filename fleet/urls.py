"""Routes of the fleet's HTML pages (namespace `fleet`), mounted at the site root."""

from django.urls import path

from fleet.views import details, lists, overview, workstation

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
]
