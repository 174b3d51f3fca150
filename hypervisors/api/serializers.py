"""Bodies of the hypervisor endpoints: a host's link and connection status, a sync diff, and
the admin's choice of what to apply."""

from __future__ import annotations

import uuid

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from hypervisors import services


class HypervisorStatusSerializer(serializers.Serializer):
    checked_at = serializers.DateTimeField()
    ok = serializers.BooleanField()
    message = serializers.CharField()
    hypervisor_version = serializers.CharField(allow_blank=True)
    hostname = serializers.CharField(allow_blank=True)
    uri = serializers.CharField(help_text="The URI the check used")


class HostHypervisorSerializer(serializers.Serializer):
    """A host's hypervisor link. The secret itself is never shown: only the name of its file."""

    host = serializers.IntegerField()
    linked = serializers.BooleanField()
    uri = serializers.CharField(allow_blank=True, help_text="hypervisor_uri of the host; empty: not linked")
    secret_ref = serializers.CharField(allow_blank=True,
                                       help_text="Name of the credentials' file in HYPERVISOR_SECRETS_DIR")
    status = HypervisorStatusSerializer(allow_null=True, help_text="The last connection check; null: never checked")


class SyncReportSerializer(serializers.Serializer):
    """One reading of the hypervisor against the inventory; `entries` as hypervisors.discovery writes them."""

    id = serializers.IntegerField()
    host = serializers.IntegerField(source="host_id")
    uri = serializers.CharField()
    created_at = serializers.DateTimeField()
    ok = serializers.BooleanField()
    error = serializers.CharField(allow_blank=True)
    trigger = serializers.CharField()
    requested_by = serializers.CharField(source="requested_by.username", default=None, allow_null=True)
    summary = serializers.DictField(source="diff.summary", default=dict,
                                    help_text="Entries per kind: new, changed, gone, elsewhere, same")
    entries = serializers.ListField(child=serializers.DictField(),
                                    help_text="One per VM: kind, uuid, name, state, vm_id, changes, vgpus, "
                                              "vgpu_notes, device_ids, notes, telemetry, appliable")
    applied = serializers.ListField(child=serializers.DictField(), read_only=True,
                                    help_text="Outcomes of what was applied from this report: uuid, name, ok, messages")
    applied_at = serializers.DateTimeField(allow_null=True)


@extend_schema_field({"oneOf": [{"type": "string", "enum": [services.APPLY_ALL, services.APPLY_NONE]},
                               {"type": "array", "items": {"type": "string", "format": "uuid"}, "minItems": 1}]})
class ApplyField(serializers.Field):
    """"all", "none", or a list of the UUIDs of the diff's entries."""

    default_error_messages = {
        "invalid": 'Use "all", "none" or a list of the UUIDs of the diff\'s entries.',
        "bad_uuid": "{value!r} is not a UUID.",
    }

    def to_internal_value(self, data):
        if isinstance(data, str) and data in (services.APPLY_ALL, services.APPLY_NONE):
            return data
        if not isinstance(data, list) or not data or len(data) > 1000:
            self.fail("invalid")
        values = []
        for value in data:
            try:
                values.append(str(uuid.UUID(str(value))))
            except ValueError:
                self.fail("bad_uuid", value=str(value)[:60])
        return values

    def to_representation(self, value):
        return value


class SyncRequestSerializer(serializers.Serializer):
    apply = ApplyField(required=False, default=services.APPLY_NONE,
                       help_text='"all" (every appliable entry), "none" (report only, the default) or a list of '
                                 "entry UUIDs")

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields)) if isinstance(self.initial_data, dict) else []
        if unknown:
            raise serializers.ValidationError({name: ["Unknown field: this endpoint takes apply."] for name in unknown})
        return attrs


class SyncAnswerSerializer(serializers.Serializer):
    report = SyncReportSerializer()
    applied = serializers.ListField(child=serializers.DictField(),
                                    help_text="Outcome of each entry applied by this request: uuid, name, ok, messages")
