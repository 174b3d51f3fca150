"""Routes of the v1 notify API, mounted at /api/v1/."""

from config.routers import AppRouter
from notify.api.views import DeliveryViewSet, NotificationChannelViewSet

router = AppRouter()
router.register("notification-channels", NotificationChannelViewSet, basename="notificationchannel")
router.register("deliveries", DeliveryViewSet, basename="delivery")

urlpatterns = router.urls
