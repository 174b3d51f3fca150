"""The admin site's view of directory accounts: who signed in through the directory, as what,
when they were last checked and why access ended. Read-only: the directory owns these rows."""

from django.contrib import admin

from identity.models import DirectoryAccount


@admin.register(DirectoryAccount)
class DirectoryAccountAdmin(admin.ModelAdmin):
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
