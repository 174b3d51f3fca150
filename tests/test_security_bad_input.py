"""No server error on bad input, anywhere: a walk over every URL the resolver knows.

Every URL pattern (the pages, the admin site, the v1 API with its routers, the schema and the
docs) is filled with real ids of a small seeded fleet, and with bad ones. Each URL then gets
values a careless client or an attacker would send: dates that do not exist, numbers that do
not fit a float or a database integer, NaN and infinities, non-ASCII digits (`int()` reads
`٣` as 3 but fails on `²`), NUL bytes, very long strings. They go

- into every query parameter the view declares (the API's OpenAPI schema, a page's FilterSet,
  the GET forms and links a page renders) and into the generic ones every client tries;
- into every field of every form a page renders (the dashboard's own forms, the admin site's
  add and change forms with their inline management forms), posted where the form posts;
- into every field of every JSON body the API's schema declares, as strings and as JSON of the
  wrong type, and as whole bodies that are not JSON, nested 100,000 levels deep, or of the
  wrong type;

as an admin, as an artist and anonymously. No response may be a server error (5xx, or an
exception out of a view), and an API 400 must name the field that was wrong, so a client can
tell which of its values to fix. Values are sampled (each parameter gets a few of them in turn,
and every value goes into all parameters at once), not the whole product, so the walk stays
within a minute on a small machine.

Each request runs in a rolled-back savepoint, so every request meets the same fleet. A 500
comes back as the view's exception (the test client re-raises it); failures are collected
over the whole walk and reported together with the request that caused them.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import traceback
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Any
from urllib.parse import parse_qsl, urljoin, urlsplit

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.test import Client
from django.urls import get_resolver

from identity.tests.oidc_support import oidc_enabled, unreachable_env
from tests.test_security_matrix import LAN_ADDR, security_world, template_of
from tests.test_security_matrix import walk as walk_routes

pytestmark = pytest.mark.django_db

ROLES = ("admin", "artist", "anonymous")

#: Text values of query parameters and form fields.
BAD_TEXT = (
    "2026-02-30", "2026-02-30T25:61:00Z", "1e400", "-1e400", "nan", "inf", "-inf", str(10**30), str(2**63),
    str(-(2**63) - 1), "-1", "0", "1.5", "²", "٣", "１２", "\x00", "1\x00", "x" * 5000, "__nope", "abc", "", " ",
    "9999-12-31T23:59:59", "0001-01-01", "253402300800",
)
#: What goes into all parameters at once, one of each kind of BAD_TEXT (each parameter on its
#: own gets the others in turn).
SWEEP_TEXT = ("2026-02-30", "9999-12-31T23:59:59", "253402300800", "1e400", "nan", "-inf", str(10**30),
              str(2**63), "-1", "²", "٣", "1\x00", "x" * 5000, "__nope", "")
#: What an artist's and an anonymous request carry (most of them stop at the permission check).
FEW_TEXT = ("2026-02-30", "1e400", "nan", str(2**63), "²", "٣", "\x00", "x" * 5000)
VALUES_OF_ROLE = {"admin": SWEEP_TEXT, "artist": FEW_TEXT, "anonymous": FEW_TEXT[::3]}
#: The admin's changelists (Django's own code reads them): numbers, dates and their edges.
CHANGELIST_TEXT = (*FEW_TEXT[::2], "__nope", "9999-12-31T23:59:59", "0001-01-01", "253402300800")
#: JSON values of body fields: the strings above, and numbers and types a field does not expect.
BAD_JSON = (
    *BAD_TEXT[:17], "x" * 5000, 10**30, 2**63, -(2**63) - 1, -1, 1e308, -1e308, 1.5, [], {}, [1, 2],
    {"a": {"b": 1}}, None, True, json.loads("[" * 20 + "]" * 20),
)
#: What goes into all fields of a body at once: every type, and the strings of FEW_TEXT.
JSON_SWEEP = (*FEW_TEXT, *(value for value in BAD_JSON if not isinstance(value, str)))
#: Whole request bodies of JSON writes.
BAD_BODIES = (
    "[" * 100_000, "[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000, "{", "not json",
    '"a string"', "[]", "[1, 2]", "null", "1e400", "NaN", '{"x": Infinity}', '{"\\u0000": "\\u0000"}',
    b"\xff\xfe\x00",
)
#: Parameters every client tries, whatever the view declares.
GENERIC_PARAMS = ("page", "page_size", "format", "start", "end", "step", "metric", "group", "ordering", "q",
                  "limit", "offset", "range", "at", "host", "status")
#: Bad values of ids in paths (those that do not match a route's pattern get the site's 404).
BAD_IDS = ("0", "999999", str(10**30), str(2**63), "-1", "٣", "²", "abc", "1.5", "%00")
#: How many of the bad values a body field gets on its own (in turn, so all are used); a query
#: parameter or a form field gets two, or one on a long form.
VALUES_PER_PARAM = 3
#: Management form fields of formsets (Django reads these two; MIN and MAX are for scripts):
#: they are also left out, and get the values a damaged or forged one has.
MANAGEMENT_FIELDS = re.compile(r"-(TOTAL|INITIAL)_FORMS$")
MANAGEMENT_VALUES = ("-1", "abc", str(10**30), "1000000", "²", "٣", "", "1e400", str(2**63))
#: A field left out of the submission instead of given a value.
MISSING = object()


# --- what the site declares ---------------------------------------------------------------


def shape(path: str) -> str:
    """`/api/v1/hosts/{id}/` and `api/v1/hosts/{pk}/` alike: `api/v1/hosts/{}/`."""
    return re.sub(r"\{\w+\}", "{}", path.lstrip("/"))


def served_schema() -> dict:
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer

    return json.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True)))


@dataclass
class Operation:
    """What the API's schema says one method of one path takes."""

    query: set[str] = field(default_factory=set)
    required: set[str] = field(default_factory=set)
    body: set[str] = field(default_factory=set)


def schema_operations() -> dict[tuple[str, str], Operation]:
    """(path shape, method) -> its query parameters (required ones apart) and JSON body fields."""
    schema = served_schema()
    components = schema.get("components", {}).get("schemas", {})

    def properties(node: dict) -> set[str]:
        if "$ref" in node:
            node = components[node["$ref"].rsplit("/", 1)[-1]]
        names = set(node.get("properties", {}))
        for part in node.get("allOf", []) + node.get("anyOf", []) + node.get("oneOf", []):
            names |= properties(part)
        return names

    operations = {}
    for path, methods in schema["paths"].items():
        for method, spec in methods.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            operation = Operation()
            for parameter in spec.get("parameters", []):
                if parameter["in"] == "query":
                    operation.query.add(parameter["name"])
                    if parameter.get("required"):
                        operation.required.add(parameter["name"])
            content = spec.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                operation.body = properties(content["application/json"]["schema"])
            operations[shape(path), method] = operation
    return operations


def declared_filters(callback) -> set[str]:
    """Query parameters of a page's FilterSet (the API's come from the schema)."""
    view_class = getattr(callback, "view_class", None)
    filterset_class = getattr(view_class, "filterset_class", None)
    return set(filterset_class.base_filters) if filterset_class else set()


@dataclass
class Form:
    action: str
    method: str
    fields: dict[str, str]  # name -> the value the page renders (the first option of a select)


class FormScraper(HTMLParser):
    """The forms of a page and the query parameter names of its links to itself."""

    def __init__(self, page_url: str):
        super().__init__(convert_charrefs=True)
        self.page_url = page_url
        self.forms: list[Form] = []
        self.link_params: set[str] = set()
        self._form: Form | None = None
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        name = attrs.get("name")
        if tag == "form":
            action = urljoin(self.page_url, attrs.get("action") or self.page_url)
            self._form = Form(urlsplit(action).path, (attrs.get("method") or "get").lower(), {})
            self.forms.append(self._form)
        elif tag == "a" and attrs.get("href"):
            target = urlsplit(urljoin(self.page_url, attrs["href"]))
            if target.path == urlsplit(self.page_url).path:
                self.link_params |= {key for key, _ in parse_qsl(target.query, keep_blank_values=True)}
        elif self._form is None or not name:
            return
        elif tag in ("input", "button"):
            if attrs.get("type") in ("checkbox", "radio") and "checked" not in attrs:
                self._form.fields.setdefault(name, "")
            else:
                self._form.fields[name] = attrs.get("value") or ""
        elif tag == "select":
            self._select = name
            self._form.fields.setdefault(name, "")
        elif tag == "option" and self._select:
            if "selected" in attrs or not self._form.fields[self._select]:
                self._form.fields[self._select] = attrs.get("value") or ""
        elif tag == "textarea":
            self._textarea = name
            self._form.fields[name] = ""

    def handle_data(self, data):
        if self._form is not None and self._textarea:
            self._form.fields[self._textarea] += data

    def handle_endtag(self, tag):
        if tag == "form":
            self._form = None
        elif tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None


# --- the seeded fleet and its URLs ----------------------------------------------------------


def object_for(template: str, name: str, w) -> Any:
    """The seeded object behind a path parameter, by the path segment before it."""
    if template.startswith("admin/r/"):  # the admin's "view on site" of a VM
        return w.vm_a
    if template.startswith("admin/") and name in ("object_id", "id"):
        app_label, model_name = template.split("/")[1:3]
        model = apps.get_model(app_label, model_name)
        return model._default_manager.order_by("pk").first()
    segment = template.split("{" + name + "}")[0].rstrip("/").rsplit("/", 1)[-1]
    by_segment = {
        "hosts": w.host_a, "gpus": w.gpu_a, "vms": w.vm_a, "artists": w.ana, "requests": w.request,
        "models": w.gpu_a.gpu_model, "suggestions": w.suggestion, "optimizer": w.run,
        "gpu-models": w.gpu_a.gpu_model, "vgpu-profiles": w.profile_12q, "vgpus": w.vgpu_a,
        "resize-requests": w.request, "notifications": w.note, "audit-events": w.event, "agents": w.agent,
        "workflow-presets": w.preset, "optimizer-runs": w.run, "operations": w.operation,
        "channels": w.channel, "notification-channels": w.channel, "deliveries": w.delivery,
        "alerts": w.alert, "alert-rules": w.alert.rule, "silences": w.silence, "licence-pools": w.pool,
        "api-tokens": w.ana_token, "feedback": w.feedback,
    }
    return by_segment[segment]


def path_values(template: str, name: str, w) -> tuple[str, list[str]]:
    """(the real value, bad values) of a path parameter."""
    if name == "format":
        return "json", ["csv", "api", "xml", "٣"]
    if name == "verb":
        return "approve", ["reject", "cancel", "nope"]
    if name == "app_label":
        return "fleet", ["nope"]
    if name == "url":
        return "no-such-page/", []
    if name == "content_type_id":
        return str(ContentType.objects.get_for_model(type(w.vm_a)).pk), list(BAD_IDS)
    obj = object_for(template, name, w)
    return (str(obj.pk) if obj is not None else "1"), list(BAD_IDS)


@dataclass(frozen=True)
class Target:
    template: str  # the resolver's route, as the role matrix writes it
    url: str
    callback: Any
    real: bool  # every path parameter holds a real id


def targets(w) -> list[Target]:
    """Every route of the resolver with real ids, and with each bad id in turn."""
    found = []
    for route, pattern in walk_routes(get_resolver().url_patterns):
        template = template_of(route)
        names = re.findall(r"\{(\w+)\}", template)
        values = {name: path_values(template, name, w) for name in names}

        def fill(chosen: dict[str, str], template=template) -> str:
            return "/" + re.sub(r"\{(\w+)\}", lambda m: chosen[m[1]], template)

        real = {name: values[name][0] for name in names}
        found.append(Target(template, fill(real), pattern.callback, True))
        for name in names:
            for bad in values[name][1]:
                found.append(Target(template, fill({**real, name: bad}), pattern.callback, False))
    return found


# --- sending and judging ---------------------------------------------------------------------


def sample(values: tuple, index: int, count: int = VALUES_PER_PARAM) -> list:
    """`count` of `values`, starting at a place that moves with `index`, so that over the
    parameters of a view every value is used."""
    return [values[(index * count + k) % len(values)] for k in range(count)]


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} chars)"


def keys_of(body: Any) -> set[str]:
    if isinstance(body, dict):
        return set(body) | {key for value in body.values() for key in keys_of(value)}
    if isinstance(body, list):
        return {key for value in body for key in keys_of(value)}
    return set()


def json_of(response) -> Any:
    if "json" not in response.get("Content-Type", ""):
        return None
    try:
        return json.loads(response.content)
    except ValueError:
        return None


@dataclass
class Walk:
    """Sends the requests and keeps what went wrong: server errors (by exception and the line of
    ours it came from, with the requests that caused it), and API 400s that name no field."""

    clients: dict[str, Client]
    errors: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    unnamed: list[str] = field(default_factory=list)
    examples: dict[str, str] = field(default_factory=dict)  # the end of each kind's first traceback
    sent: int = 0

    def send(self, role: str, method: str, url: str, *, query: dict | None = None, data: Any = None,
             body: str | bytes | None = None, form: bool = False, what: str = ""):
        client = self.clients[role]
        self.sent += 1
        label = f"{role} {method.upper()} {url} {what}".rstrip()
        # A request may sign its client out (a logout form, a password change): the next one
        # is still sent by the same role, with the same session.
        cookies = client.cookies
        client.cookies = copy.copy(cookies)
        try:
            with transaction.atomic():
                if body is not None:
                    response = client.generic(method.upper(), url, body, "application/json")
                elif data is None:
                    response = getattr(client, method)(url, query)
                elif form:
                    response = client.post(url, data)
                else:
                    response = getattr(client, method)(url, json.dumps(data), content_type="application/json")
                if getattr(response, "streaming", False):
                    b"".join(response.streaming_content)  # a CSV export fails while it streams
                transaction.set_rollback(True)
        except Exception as exc:  # noqa: BLE001 - every exception out of a view is a finding
            frames = traceback.extract_tb(exc.__traceback__)
            ours = [f for f in frames if "site-packages" not in f.filename and "/tests/" not in f.filename]
            where = ours[-1] if ours else frames[-1]
            key = f"{type(exc).__name__} at {where.filename}:{where.lineno}"
            if key not in self.errors:  # the first one's traceback, a frame a line
                self.examples[key] = "\n".join(
                    [f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno} {f.name}" for f in frames[-25:]]
                    + [f"{type(exc).__name__}: {str(exc)[:200]}"])
            self.errors[key].append(label)
            return None
        finally:
            client.cookies = cookies
        if response.status_code >= 500:
            self.errors[f"HTTP {response.status_code}"].append(label)
        return response

    def check_named(self, response, name: str, baseline, label: str) -> None:
        """An API 400 about a parameter or field must name it: a key of its body, or in its detail.

        Not a finding: a 400 naming other fields only (DRF reports every field it refuses at once,
        so this one was accepted), a placement rule's refusal (it names its rule), or the 400 the
        request without the value gets too."""
        if response is None or response.status_code != 400:
            return
        body = json_of(response)
        if body is None:
            self.unnamed.append(f"{label}: the 400 is not JSON")
            return
        keys = keys_of(body)
        if name in keys or (isinstance(body, dict) and name in str(body.get("detail", ""))):
            return
        if keys - {"detail", "non_field_errors"} or (isinstance(body, dict) and "violations" in body):
            return
        if baseline is not None and baseline.status_code == 400 and json_of(baseline) == body:
            return
        self.unnamed.append(f"{label}: {short(body)}")

    def report(self) -> str:
        lines = [f"{len(self.errors)} kinds of server error over {self.sent} requests:"]
        for key, labels in sorted(self.errors.items()):
            lines.append(f"- {key}: {len(labels)} requests, e.g.")
            lines += [f"    {label}" for label in labels[:3]]
            lines += [f"    | {line}" for line in self.examples.get(key, "").splitlines()]
        if self.unnamed:
            lines.append(f"{len(self.unnamed)} API 400s that name no field, e.g.")
            lines += [f"    {label}" for label in self.unnamed[:15]]
        return "\n".join(lines)


@pytest.fixture
def world(fleet_world, admin_user):
    return security_world(fleet_world, admin_user)


@pytest.fixture
def walk(world) -> Iterator[Walk]:
    clients = {role: Client(REMOTE_ADDR=LAN_ADDR) for role in ROLES}
    clients["admin"].force_login(world.admin)
    clients["artist"].force_login(world.ana.user)
    # Thousands of 4xx, each logged with its traceback, would take a good part of the walk's time;
    # a 5xx comes back as its exception anyway.
    request_log = logging.getLogger("django.request")
    level = request_log.level
    request_log.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        # The admin's list filters hand a typed date to the query as it is: a naive one is read in
        # the server's zone with a warning (not an error), which the test settings make an exception.
        warnings.filterwarnings("ignore", r"DateTimeField .* received a naive datetime", RuntimeWarning)
        yield Walk(clients)
    request_log.setLevel(level)


def valid_value(name: str) -> str:
    """A value a required parameter accepts, so that the others are judged on their own."""
    end = datetime.now(UTC).replace(microsecond=0)
    return {"start": (end - timedelta(hours=6)).isoformat(), "end": end.isoformat()}.get(name, "")


def one_row_each(names: Iterable[str]) -> set[str]:
    """The fields of the first row of each formset (`artists-0-count`, not `artists-3-count`):
    the rows are alike, and each costs a request per value."""
    first: dict[tuple[str, str], tuple[int, str]] = {}
    kept = set()
    for name in names:
        match = re.fullmatch(r"(.+)-(\d+)-(.+)", name)
        if match is None:
            kept.add(name)
        else:
            key, index = (match[1], match[3]), int(match[2])
            if key not in first or index < first[key][0]:
                first[key] = (index, name)
    return kept | {name for _, name in first.values()}


def fuzz_query(walk: Walk, role: str, url: str, params: Iterable[str], *, declared: Iterable[str] = (),
               api: bool = False, base: dict[str, str] | None = None, values: tuple | None = None,
               per_param: int = 2) -> None:
    """Each bad value (`values`, by default the role's) in all `params` at once; then, as an admin,
    each `declared` parameter on its own (`base` giving the others) with `per_param` values in turn."""
    base = base or {}
    params = sorted(set(params))
    for value in values or VALUES_OF_ROLE[role]:
        walk.send(role, "get", url, query={**base, **{p: value for p in params}}, what=f"all params={short(value)}")
    if role != "admin":
        return
    baseline = walk.send(role, "get", url, query=base, what="(baseline)")
    declared = sorted(one_row_each(declared))
    per_param = per_param if len(declared) <= 12 else 1  # a long form: one value each, in turn
    for index, name in enumerate(declared):
        values = sample(MANAGEMENT_VALUES, index, 4) if MANAGEMENT_FIELDS.search(name) else \
            sample(BAD_TEXT, index, per_param)
        for value in values:
            what = f"?{name}={short(value)}"
            response = walk.send(role, "get", url, query={**base, name: value}, what=what)
            if api:
                walk.check_named(response, name, baseline, f"{role} GET {url} {what}")


def is_api(template: str) -> bool:
    return template.startswith("api/")


def view_of(callback) -> Any:
    return getattr(callback, "cls", getattr(callback, "view_class", callback))


def scrape(response, url: str) -> FormScraper:
    scraper = FormScraper(url)
    if response is not None and response.status_code in (200, 400) and not getattr(response, "streaming", False) \
            and "html" in response.get("Content-Type", ""):
        scraper.feed(response.content.decode())
    return scraper


# --- the walks ----------------------------------------------------------------------------------


def test_every_url_answers_bad_ids_without_a_server_error(walk, world):
    """Bad ids (0, huge, negative, non-ASCII digits, NUL) in every path, read by an admin; a third
    of them read by the other roles too and written to by an admin with every method."""
    seen: dict[str, int] = defaultdict(int)
    for target in targets(world):
        if target.real:
            continue
        count = seen[target.template]
        seen[target.template] += 1
        if target.template.startswith("admin/"):
            # The admin site sends everyone else to its login before it reads an id; its pages
            # read ids alike, so every other one is enough.
            if count % 2 == 0:
                walk.send("admin", "get", target.url)
            continue
        for role in ROLES:
            if role == "admin" or count % 3 == 0:
                walk.send(role, "get", target.url)
        if count % 3 == 0:
            for method in ("post", "put", "patch", "delete") if is_api(target.template) else ("post",):
                walk.send("admin", method, target.url, data={})
    assert not walk.errors, walk.report()


def test_every_query_parameter_answers_bad_values_without_a_server_error(walk, world):
    """Pages and API: the parameters the schema, the FilterSet, the page's forms and links
    declare, and the generic ones; an API 400 names the parameter."""
    operations = schema_operations()
    seen_views = set()
    for target in targets(world):
        if not target.real or target.template.startswith("admin/"):
            continue
        operation = operations.get((shape(target.template), "get"), Operation())
        base = {name: valid_value(name) for name in operation.required}
        scraper = scrape(walk.send("admin", "get", target.url, query=base), target.url)
        # A page's own GET form, as it renders it, is the base its fields are judged against.
        for form in scraper.forms:
            if form.method == "get" and form.action == target.url:
                base.update(form.fields)
        declared = operation.query | declared_filters(target.callback) | scraper.link_params | set(base)
        # The first URL of a view gets everything; its others (`hosts.json`, another verb) a few values.
        first = view_of(target.callback) not in seen_views
        seen_views.add(view_of(target.callback))
        for role in ROLES:
            fuzz_query(walk, role, target.url, {*GENERIC_PARAMS, *declared}, declared=declared if first else (),
                       api=is_api(target.template), base=base, values=None if first else FEW_TEXT[::2])
    assert not walk.errors, walk.report()
    assert not walk.unnamed, walk.report()


def test_every_api_body_field_answers_bad_values_without_a_server_error(walk, world):
    """Every write of the API: bodies that are not JSON, too deep or of the wrong type, and each
    field of the schema with strings, numbers and types it does not expect; a 400 names the field."""
    operations = schema_operations()
    for target in targets(world):
        if not target.real or not is_api(target.template):
            continue
        for method in ("post", "put", "patch"):
            operation = operations.get((shape(target.template), method))
            if operation is None:
                continue
            fields = sorted(operation.body)
            # A PATCH validates as its PUT does, field by field: it gets the fields on their own.
            for role in ROLES if method != "patch" or (shape(target.template), "put") not in operations else ():
                bodies, values = (BAD_BODIES, JSON_SWEEP) if role == "admin" else (BAD_BODIES[:3], BAD_JSON[::6])
                for body in bodies:
                    walk.send(role, method, target.url, body=body, what=f"body {short(body)}")
                for value in values:
                    walk.send(role, method, target.url, data={f: value for f in fields},
                              what=f"all fields={short(value)}")
            baseline = walk.send("admin", method, target.url, data={}, what="(baseline)")
            for index, name in enumerate(fields):
                for value in sample(BAD_JSON, index):
                    what = f"{name}={short(value)}"
                    response = walk.send("admin", method, target.url, data={name: value}, what=what)
                    walk.check_named(response, name, baseline, f"admin {method.upper()} {target.url} {what}")
    assert not walk.errors, walk.report()
    assert not walk.unnamed, walk.report()


def page_forms(walk: Walk, world) -> list[tuple[str, Form]]:
    """(role, form) of every POST form the pages render to an admin and to an artist, the admin
    site's add and change pages included (sign-out aside)."""
    forms, seen = [], set()
    for target in targets(world):
        if not target.real or is_api(target.template):
            continue
        for role in ("admin", "artist"):
            for form in scrape(walk.send(role, "get", target.url), target.url).forms:
                key = (role, form.action, tuple(sorted(form.fields)))
                if form.method == "post" and key not in seen and form.action != "/logout/":
                    seen.add(key)
                    forms.append((role, form))
    return forms


def test_every_form_answers_bad_values_without_a_server_error(walk, world):
    """Each POST form of the site, as its page renders it, with bad values in every field; the
    management forms of formsets also left out, negative, huge and not numbers. The admin site's
    forms (Django's code, with our forms and rules inside) get fewer values each, in turn."""
    forms = page_forms(walk, world)
    actions = {form.action for _, form in forms}
    assert {"/admin/fleet/host/add/", f"/admin/fleet/host/{world.host_a.pk}/change/",
            f"/me/vms/{world.vm_a.pk}/request/", f"/scheduler/gpus/{world.gpu_a.pk}/"} <= actions, actions
    shapes: dict[tuple, int] = defaultdict(int)
    changed_models = {re.sub(r"\d+/change/$", "", form.action) for _, form in forms if form.action.endswith("/change/")}
    for form_index, (role, form) in enumerate(forms):
        admin_site = form.action.startswith("/admin/")
        names = sorted(form.fields)
        # Forms of one shape (the admin's delete confirmations, its changelist actions) after
        # the first two, and add forms of models whose change form is walked (it has the same
        # fields and more): all their fields at once only.
        shapes[tuple(names)] += 1
        if admin_site and (shapes[tuple(names)] > 2 or form.action.removesuffix("add/") in changed_models):
            for value in sample(BAD_TEXT, form_index, 2):
                walk.send(role, "post", form.action, data={n: value for n in names}, form=True,
                          what=f"all fields={short(value)}")
            continue
        for value in FEW_TEXT if admin_site else VALUES_OF_ROLE[role]:
            walk.send(role, "post", form.action, data={n: value for n in names}, form=True,
                      what=f"all fields={short(value)}")
        for index, name in enumerate(sorted(one_row_each(names))):
            if MANAGEMENT_FIELDS.search(name):
                values = [MISSING, *sample(MANAGEMENT_VALUES, index + form_index, 3)]
            else:
                values = sample(BAD_TEXT, index + form_index, 1 if admin_site else 2)
            for value in values:
                data = {n: v for n, v in form.fields.items() if n != name}
                if value is not MISSING:
                    data[name] = value
                walk.send(role, "post", form.action, data=data, form=True,
                          what=f"{name}={'(missing)' if value is MISSING else short(value)}")
        walk.send("anonymous", "post", form.action, data={n: BAD_TEXT[0] for n in names}, form=True)
    assert not walk.errors, walk.report()


def test_admin_changelists_answer_bad_query_values_without_a_server_error(walk, world):
    """Search, ordering, pages and every filter link of the admin's changelists."""
    for model in admin.site._registry:
        url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        scraper = scrape(walk.send("admin", "get", url), url)
        params = scraper.link_params | {n for f in scraper.forms if f.method == "get" for n in f.fields}
        params |= {"q", "o", "p", "e", "all", "_to_field", "_popup"}
        fuzz_query(walk, "admin", url, params, declared=params, values=CHANGELIST_TEXT, per_param=1)
    assert not walk.errors, walk.report()


def test_the_oidc_routes_answer_bad_values_without_a_server_error(walk, world):
    """OpenID Connect's routes exist only while it is configured (config/urls.py), so the walks
    above never meet them: here they are walked with OIDC on (a provider at a closed port), each
    role sending bad values in the parameters a provider and a browser send (the code, the state,
    an error, the next page), and, with a sign-in under way, a code the provider never issued."""
    with oidc_enabled(unreachable_env()):
        routes = [template_of(route) for route, _ in walk_routes(get_resolver().url_patterns)
                  if template_of(route).startswith("oidc/")]
        assert routes == ["oidc/callback/", "oidc/authenticate/", "oidc/logout/"]
        params = {*GENERIC_PARAMS, "code", "state", "error", "error_description", "next", "session_state"}
        for url in ("/" + route for route in routes):
            for role in ROLES:
                fuzz_query(walk, role, url, params, declared=params)
                walk.send(role, "post", url, data={name: BAD_TEXT[0] for name in params}, form=True)
        for role in ROLES:
            for value in BAD_TEXT:
                with transaction.atomic():
                    # A sign-in under way (its state in the session): the callback asks the
                    # unreachable provider about a code it never issued, then reads an error.
                    location = walk.clients[role].get("/oidc/authenticate/")["Location"]
                    state = dict(parse_qsl(urlsplit(location).query))["state"]
                    walk.send(role, "get", "/oidc/callback/", query={"code": value, "state": state},
                              what=f"(a sign-in under way) code={short(value)}")
                    walk.send(role, "get", "/oidc/callback/", query={"error": value, "state": state,
                                                                     "error_description": value})
                    transaction.set_rollback(True)
    assert not walk.errors, walk.report()
