"""The admin site's Users pages, with sessions: where a user is signed in, and signing them out;
and the directory accounts (who signed in through the directory, as what, why access ended).

django.contrib.auth's user admin stays as it is, subclassed (whatever class registered it) and
registered again with three additions: the user's active sessions (signed in, last seen, address,
how they signed in) shown read-only on their page, a "Sign out everywhere" button there, and the
same as an action of the Users list. Both end sessions through `identity.sessions.end_sessions`,
which writes the audit event, and say how many sessions ended.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_permission_codename, get_user_model
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse

from identity import sessions
from identity.models import DirectoryAccount, UserSession

User = get_user_model()
#: The user admin registered before this app's (django.contrib.auth's UserAdmin, unless replaced).
RegisteredUserAdmin = type(admin.site.get_model_admin(User))


class UserSessionInline(admin.TabularInline):
    """A user's live sessions, read-only: they are made by signing in, not in the admin."""

    model = UserSession
    verbose_name = "active session"
    verbose_name_plural = "active sessions"
    fields = ("signed_in_at", "last_seen_at", "address", "method", "user_agent")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def get_queryset(self, request):
        return super().get_queryset(request).live()

    def has_view_permission(self, request, obj=None):
        # Whoever may see the user sees where they are signed in; no permission of its own to grant.
        opts = User._meta
        return any(request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")
                   for action in ("view", "change"))

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class UserAdmin(RegisteredUserAdmin):
    change_form_template = "identity/admin/user_change_form.html"
    inlines = (*RegisteredUserAdmin.inlines, UserSessionInline)
    actions = (*(RegisteredUserAdmin.actions or ()), "sign_out_everywhere")

    def get_inline_instances(self, request, obj=None):
        # Adding a user: nobody has signed in as them yet.
        return super().get_inline_instances(request, obj) if obj is not None else []

    def get_urls(self):
        opts = self.opts
        return [
            path("<path:object_id>/sign-out-everywhere/", self.admin_site.admin_view(self.sign_out_everywhere_view),
                 name=f"{opts.app_label}_{opts.model_name}_sign_out_everywhere"),
            *super().get_urls(),
        ]

    @admin.action(description="Sign out everywhere", permissions=["change"])
    def sign_out_everywhere(self, request, queryset):
        users = list(queryset.order_by(User.USERNAME_FIELD))
        ended = sum(sessions.end_sessions(user) for user in users)
        self.message_user(request, sessions.ended_message(ended, [user.get_username() for user in users]),
                          messages.SUCCESS)

    def sign_out_everywhere_view(self, request, object_id):
        """The change page's button (POST): end every session of this user, back to their page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        user = self.get_object(request, unquote(object_id))
        if user is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_change_permission(request, user):
            raise PermissionDenied
        ended = sessions.end_sessions(user)
        self.message_user(request, sessions.ended_message(ended, [user.get_username()]), messages.SUCCESS)
        opts = self.opts
        return HttpResponseRedirect(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[user.pk],
                                            current_app=self.admin_site.name))


admin.site.unregister(User)
admin.site.register(User, UserAdmin)


@admin.register(DirectoryAccount)
class DirectoryAccountAdmin(admin.ModelAdmin):
    """Read-only: the directory owns these rows."""

    list_display = ["user", "source", "role", "last_sign_in_at", "last_synced_at", "refused_reason"]
    list_filter = ["source", "role"]
    list_select_related = ["user"]
    search_fields = ["user__username", "subject"]
    readonly_fields = ["user", "source", "subject", "groups", "role", "first_sign_in_at", "last_sign_in_at",
                       "last_synced_at", "refused_reason"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
