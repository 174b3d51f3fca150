"""Routes of the v1 inventory API, mounted at /api/v1/ (plural kebab-case, DESIGN.md)."""

from rest_framework.routers import DefaultRouter

from fleet.api import views

router = DefaultRouter()
router.register("gpu-models", views.GpuModelViewSet, basename="gpumodel")
router.register("vgpu-profiles", views.VgpuProfileViewSet, basename="vgpuprofile")
router.register("hosts", views.HostViewSet, basename="host")
router.register("gpus", views.GpuViewSet, basename="gpu")
router.register("artists", views.ArtistViewSet, basename="artist")
router.register("vms", views.VirtualMachineViewSet, basename="virtualmachine")
router.register("vgpus", views.VgpuViewSet, basename="vgpu")

urlpatterns = router.urls
