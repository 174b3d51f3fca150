"""Bodies of the API's error answers, shared by every app's API and documented once in the
schema: a refusal of a rule (`PlacementErrorSerializer`), a plain `detail`, and the three shapes
a 400 of a rule-governed write may take."""

from drf_spectacular.extensions import OpenApiSerializerExtension
from rest_framework import serializers


class ViolationSerializer(serializers.Serializer):
    rule = serializers.CharField(help_text="Stable code of the rule, e.g. frame_buffer, max_per_gpu, host_vcpu")
    message = serializers.CharField(help_text="The refusal with the numbers behind it")


class PlacementErrorSerializer(serializers.Serializer):
    """Body of a 400 (a placement rule refused) or 409 (the fleet changed under the request)."""

    detail = serializers.CharField()
    violations = ViolationSerializer(many=True)


class DetailSerializer(serializers.Serializer):
    """Body of a plain error, e.g. a 409 when a deleted object is still referred to."""

    detail = serializers.CharField()


class InvalidOrRefusedSerializer(serializers.Serializer):
    """Body of a 400 on a write the placement rules govern: DRF's field messages (invalid input),
    its `detail` alone (an unreadable body), or a rule's refusal (`PlacementErrorSerializer`).
    Documented by `InvalidOrRefusedSchema`: a client must expect all three shapes."""


class InvalidOrRefusedSchema(OpenApiSerializerExtension):
    """Schema of `InvalidOrRefusedSerializer`: any of the three bodies a 400 of such a write has."""

    target_class = InvalidOrRefusedSerializer

    def map_serializer(self, auto_schema, direction):
        field_messages = {"type": "object", "description": "Messages by field name (`non_field_errors`: the whole)",
                          "additionalProperties": {"type": "array", "items": {"type": "string"}}}
        return {"anyOf": [
            auto_schema.resolve_serializer(PlacementErrorSerializer, direction).ref,
            auto_schema.resolve_serializer(DetailSerializer, direction).ref,
            field_messages,
        ]}
