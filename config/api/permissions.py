"""Who may do what through the v1 API (DESIGN.md, "Roles").

Reading is for every signed-in user; what each one sees is scoped by `fleet.queries`, so an
object outside an artist's scope is a 404. Writing the inventory is for staff only: an artist
gets 403 on every POST, PUT, PATCH and DELETE, whichever object it names.
"""

from rest_framework.permissions import SAFE_METHODS, BasePermission

from config.roles import is_fleet_admin


class IsFleetAdminOrReadOnly(BasePermission):
    message = "Only fleet admins (staff) may change the inventory."

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in SAFE_METHODS or is_fleet_admin(request.user)


class IsFleetAdmin(BasePermission):
    """Staff only, for every method, reading included: for views that show the whole fleet.

    Subclasses only change `message`, so a refused artist reads what the view is for.
    """

    message = "Only fleet admins (staff) may do this."

    def has_permission(self, request, view) -> bool:
        return is_fleet_admin(request.user)
