"""Bodies of the API's error answers, shared by every app's API and documented once in the
schema: a refusal of a rule (`PlacementErrorSerializer`), a plain `detail`, and the three shapes
a 400 of a rule-governed write may take."""

from django.urls import NoReverseMatch
from drf_spectacular.extensions import OpenApiSerializerExtension
from rest_framework import serializers
from rest_framework.reverse import reverse

from config.api.filters import requested_expansions


class ViolationSerializer(serializers.Serializer):
    rule = serializers.CharField(help_text="Stable code of the rule, e.g. frame_buffer, max_per_gpu, host_vcpu")
    message = serializers.CharField(help_text="The refusal with the numbers behind it")
    host = serializers.CharField(required=False, help_text="The host the placement was refused on (placements on "
                                                           "a GPU), as the `detail` names it")


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


# -- related objects as {id, url, display} (`?expand=`) --------------------------------------


class RelatedRefSerializer(serializers.Serializer):
    """A related object as `?expand=` shows it: its id, its API address and its name."""

    id = serializers.IntegerField()
    url = serializers.CharField(allow_null=True, help_text="Its address in this API (null: not an API resource)")
    display = serializers.CharField(help_text="Its name as the dashboard shows it")


def related_ref(obj, request) -> dict | None:
    """`{id, url, display}` of `obj` (None stays None). The URL is the detail route of the
    resource whose router basename is the model's name (`gpumodel-detail`), or null."""
    if obj is None:
        return None
    try:
        url = reverse(f"{obj._meta.model_name}-detail", kwargs={"pk": obj.pk}, request=request)
    except NoReverseMatch:
        url = None
    return {"id": obj.pk, "url": url, "display": str(obj)}


class ExpandableMixin:
    """A ModelSerializer whose related fields named in `expandable_fields` are read as nested
    `{id, url, display}` when the request asks (`?expand=host,gpu_model` or `?expand=all`;
    `config.api.filters`). Default answers are unchanged: ids stay ids. Writes take ids as always."""

    #: Foreign keys of the serializer (same name as the model's field) that `?expand=` may name.
    expandable_fields: tuple[str, ...] = ()

    def _expansions(self) -> tuple[str, ...]:
        # Parsed once per response: a list's rows share their root serializer's context.
        context, key = self.context, f"_expand:{type(self).__qualname__}"
        if key not in context:
            context[key] = requested_expansions(context.get("request"), self.expandable_fields)
        return context[key]

    def to_representation(self, instance):
        data = super().to_representation(instance)
        request = self.context.get("request")
        for name in self._expansions():
            if name in data:
                data[name] = related_ref(getattr(instance, name), request)
        return data
