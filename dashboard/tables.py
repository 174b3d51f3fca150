"""One django-tables2 table per list page: its columns (header, cell, tooltip), which of them sort
and by what, and what its CSV export holds, all in one class (NetBox's `tables/` pattern).

Columns shown on the page and columns of the export are the same declarations: a column hidden
on the page (`visible=False`) is exported, one marked `exclude_from_export` is only drawn. The
export names its columns by `export_names` (the CSV headers carry units: `ram_gib`) and takes
each cell from the table's `value_<column>` method, so a page can draw "16 / 72" while the
export writes 16 and 72 in two columns. The export itself is written by `dashboard.listing`
through the one CSV writer, which neutralises formulas.

Sorting is `?ordering=<column>` (`-<column>` reverses), as bookmarks have it; an unknown key
falls back to the table's default, and every ordering ends with an id tiebreak so pages never
repeat or skip a row.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

import django_tables2 as tables
from django.db.models import QuerySet
from django_tables2 import A
from django_tables2.data import TableQuerysetData


def _iso(moment) -> str | None:
    return moment.astimezone(UTC).isoformat() if moment else None


def num(title: str = "", td: dict | None = None) -> dict:
    """attrs of a right-aligned (numeric) column, with a header tooltip."""
    th = {"class": "num"}
    if title:
        th["title"] = title
    return {"th": th, "td": {"class": "num", **(td or {})}}


def tip(title: str) -> dict:
    """attrs of a column whose header has a tooltip (e.g. what it counts)."""
    return {"th": {"title": title}}


class ListTable(tables.Table):
    """The base of every list table: `?ordering=` and `?page=` as the pages always read them, an
    id tiebreak after any ordering, and the CSV export's columns."""

    #: Column name -> its CSV header, where they differ.
    export_names: dict[str, str] = {}

    class Meta:
        order_by_field = "ordering"
        page_field = "page"

    @property
    def order_by(self):
        return self._order_by

    @order_by.setter
    def order_by(self, value) -> None:
        """Order by `value` when its columns sort, else by the table's default; then by id."""
        tables.Table.order_by.fset(self, value)
        if not isinstance(self.data, TableQuerysetData):
            return  # a chunk of an export: already in the queryset's order
        if not self._order_by and self._meta.order_by:
            tables.Table.order_by.fset(self, self._meta.order_by)
        queryset: QuerySet = self.data.data
        descending = bool(self._order_by) and self._order_by[0].is_descending
        self.data.data = queryset.order_by(*queryset.query.order_by, "-pk" if descending else "pk")

    def export_columns(self) -> list:
        return [column for column in self.columns.iterall() if not column.column.exclude_from_export]

    def export_header(self) -> list[str]:
        return [self.export_names.get(column.name, column.name) for column in self.export_columns()]

    def export_rows(self) -> list[list[Any]]:
        """Each row's export values, in `export_header` order (not yet made safe: the CSV writer does that)."""
        names = [column.name for column in self.export_columns()]
        return [[row.get_cell_value(name) for name in names] for row in self.rows]


HIDDEN = {"visible": False, "orderable": False}


# Fleet ---------------------------------------------------------------------------------------


class HostTable(ListTable):
    """Hosts with the vCPUs and RAM their VMs claim, their GPUs and the status of their agents."""

    name = tables.Column("Host", linkify=("fleet:host-detail", [A("pk")]))
    hypervisor = tables.Column("Hypervisor", order_by=("hypervisor", "name"))
    gpu_count = tables.Column("GPUs", attrs=num())
    allocated_vcpus = tables.TemplateColumn(
        "{{ record.allocated_vcpus }} / {{ record.cpu_threads }}", verbose_name="vCPUs allocated / threads",
        attrs=num("vCPUs the host's VMs claim, against its hardware threads",
                  td={"class": "num nowrap", "title": lambda record: f"vCPU overcommit ×{record.vcpu_overcommit}"}))
    cpu_threads = tables.Column(visible=False)
    allocated_ram_gib = tables.TemplateColumn(
        "{{ record.allocated_ram_gib }} / {{ record.ram_gib }} GiB", verbose_name="RAM allocated / total",
        attrs=num("GiB the host's VMs claim, against the RAM available to VMs",
                  td={"class": "num nowrap", "title": lambda record: f"RAM overcommit ×{record.ram_overcommit}"}))
    ram_gib = tables.Column(visible=False)
    agents = tables.TemplateColumn(
        "{% url 'telemetry:agent-list' as agents_url %}"
        "{% for agent in record.agents.all %}{% with status=agent.status %}"
        '<a class="badge {{ status }}" href="{{ agents_url }}?host={{ record.pk }}" title="Agent {{ agent.name }}">'
        "{{ agent.name }}: {{ status }}</a> {% endwith %}{% empty %}<span class=\"muted\">no agent</span>{% endfor %}",
        verbose_name="Agents", orderable=False, attrs=tip("Sources of the host's samples and their status"))

    export_names = {"gpu_count": "gpus", "allocated_vcpus": "vcpus_allocated", "allocated_ram_gib": "ram_allocated_gib"}

    class Meta(ListTable.Meta):
        order_by = ("name",)

    def value_hypervisor(self, record):
        return record.hypervisor

    def value_allocated_vcpus(self, record):
        return record.allocated_vcpus

    def value_allocated_ram_gib(self, record):
        return record.allocated_ram_gib

    def value_agents(self, record):
        return "; ".join(f"{agent.name} ({agent.status})" for agent in record.agents.all())


_GPU_SAMPLE = (
    '{% if record.latest %}<span{% if record.latest_is_old %} class="muted"{% endif %} title="Sampled '
    "{{ record.latest.ts|date:'Y-m-d H:i:s' }} UTC{% if record.latest_is_old %} (old){% endif %}\">"
    "{% if record.latest.FIELD is None %}n/a{% else %}{{ record.latest.FIELD|floatformat:0 }} UNIT{% endif %}</span>"
    '{% else %}<span class="muted">EMPTY</span>{% endif %}'
)


class GpuTable(ListTable):
    """GPUs with the frame buffer their vGPUs take and their latest utilization and temperature
    (`latest`, `fb_pct` and `fb_high` are set by the page's `decorate`)."""

    host = tables.Column("Host", accessor="host__name", linkify=("fleet:host-detail", [A("host_id")]),
                         order_by=("host__name", "pci_bus_id"))
    pci_bus_id = tables.TemplateColumn(
        '<a class="mono" href="{% url \'fleet:gpu-detail\' record.pk %}" '
        "title=\"{{ record.uuid|default:'no UUID reported yet' }}\">{{ record.pci_bus_id }}</a>",
        verbose_name="PCI bus id", order_by=("pci_bus_id", "host__name"))
    uuid = tables.Column(**HIDDEN)
    gpu_model = tables.Column("Model", accessor="gpu_model__name",
                              order_by=("gpu_model__name", "host__name", "pci_bus_id"))
    mode = tables.Column("Mode", order_by=("mode", "host__name", "pci_bus_id"))
    size_mode = tables.Column("Size mode", order_by=("size_mode", "host__name", "pci_bus_id"))
    used_fb_mib = tables.TemplateColumn(
        '<div class="fb-cell"><span class="nowrap">{{ record.used_fb_mib }} / {{ record.gpu_model.fb_mib }} MiB</span> '
        '<div class="bar{% if record.fb_high %} high{% endif %}" role="img" aria-label="{{ record.fb_pct }}% of the '
        'frame buffer allocated"><span style="width: {{ record.fb_pct }}%"></span></div></div>',
        verbose_name="Frame buffer allocated / physical",
        attrs=num("MiB of the vGPUs' profiles, against the GPU's frame buffer"))
    fb_physical_mib = tables.Column(accessor="gpu_model__fb_mib", **HIDDEN)
    vgpu_count = tables.Column("vGPUs", attrs=num())
    util_gpu = tables.TemplateColumn(
        _GPU_SAMPLE.replace("FIELD", "util_gpu").replace("UNIT", "%").replace("EMPTY", "no samples yet"),
        verbose_name="Utilization", orderable=False, attrs=num("GPU utilization, %, of the newest sample"))
    temp_c = tables.TemplateColumn(
        _GPU_SAMPLE.replace("FIELD", "temp_c").replace("UNIT", "°C").replace("EMPTY", "—"),
        verbose_name="Temperature", orderable=False, attrs=num("°C, of the newest sample"))
    sampled_at_utc = tables.Column(empty_values=(), **HIDDEN)

    export_names = {"gpu_model": "model", "used_fb_mib": "fb_allocated_mib", "vgpu_count": "vgpus",
                    "util_gpu": "util_gpu_pct"}

    class Meta(ListTable.Meta):
        order_by = ("host",)

    def value_pci_bus_id(self, record):
        return record.pci_bus_id

    def value_mode(self, record):
        return record.mode

    def value_size_mode(self, record):
        return record.size_mode

    def value_used_fb_mib(self, record):
        return record.used_fb_mib

    def value_util_gpu(self, record):
        return (record.latest or {}).get("util_gpu")

    def value_temp_c(self, record):
        return (record.latest or {}).get("temp_c")

    def value_sampled_at_utc(self, record):
        return _iso((record.latest or {}).get("ts"))


class VirtualMachineTable(ListTable):
    """VMs with their artist, host, vGPU profiles, vCPUs and RAM (`vgpu_fb_mib` set by `decorate`)."""

    name = tables.Column("VM", linkify=("fleet:vm-detail", [A("pk")]))
    uuid = tables.Column(**HIDDEN)
    artist = tables.TemplateColumn(
        '{% if record.artist %}<a href="{% url \'fleet:artist-detail\' record.artist_id %}">'
        "{{ record.artist.name }}</a>"
        '{% else %}<span class="muted">unassigned</span>{% endif %}',
        verbose_name="Artist", order_by=("artist__name", "name"))
    host = tables.TemplateColumn(
        '{% if record.host %}<a href="{% url \'fleet:host-detail\' record.host_id %}">{{ record.host.name }}</a>'
        '{% else %}<span class="muted">not placed</span>{% endif %}',
        verbose_name="Host", order_by=("host__name", "name"))
    profiles = tables.TemplateColumn(
        '{% for vgpu in record.vgpus.all %}<span class="profile" title="{{ vgpu.profile.fb_mib }} MiB">'
        "{{ vgpu.profile.name }}</span>{% if not forloop.last %}, {% endif %}"
        '{% empty %}<span class="muted">no vGPU</span>{% endfor %}',
        verbose_name="vGPU profiles", orderable=False, attrs=tip("Profiles of the VM's vGPUs, with their frame buffer"))
    vgpu_fb_mib = tables.Column(empty_values=(), **HIDDEN)
    vcpus = tables.Column("vCPUs", attrs=num())
    ram_gib = tables.TemplateColumn("{{ record.ram_gib }} GiB", verbose_name="RAM",
                                    attrs=num("GiB", td={"class": "num nowrap"}))

    class Meta(ListTable.Meta):
        order_by = ("name",)

    def value_artist(self, record):
        return record.artist.name if record.artist else None

    def value_host(self, record):
        return record.host.name if record.host else None

    def value_profiles(self, record):
        return "; ".join(vgpu.profile.name for vgpu in record.vgpus.all())

    def value_vgpu_fb_mib(self, record):
        return record.vgpu_fb_mib

    def value_ram_gib(self, record):
        return record.ram_gib


class ArtistTable(ListTable):
    """Artists with their user account, workflow, load class and number of VMs."""

    name = tables.Column("Artist", linkify=("fleet:artist-detail", [A("pk")]))
    user = tables.TemplateColumn(
        '{% if record.user %}{{ record.user.username }}{% else %}<span class="muted">no account</span>{% endif %}',
        verbose_name="User", order_by=("user__username", "name"))
    workflow = tables.Column("Workflow", order_by=("workflow", "name"))
    user_type = tables.Column("User type", order_by=("user_type", "name"))
    vm_count = tables.Column("VMs", attrs=num(), order_by=("vm_count", "name"))

    export_names = {"user": "username", "vm_count": "vms"}

    class Meta(ListTable.Meta):
        order_by = ("name",)

    def value_user(self, record):
        return record.user.username if record.user else None

    def value_workflow(self, record):
        return record.workflow

    def value_user_type(self, record):
        return record.user_type


# Telemetry -----------------------------------------------------------------------------------


class AgentTable(ListTable):
    """Agents with status, last success, last error, failures in a row and clock skew
    (`status_now` and `error_is_current` set by the page's `decorate`)."""

    name = tables.TemplateColumn(
        '<a href="{% url \'admin:telemetry_agent_change\' record.pk %}" title="Edit on the admin site">'
        "{{ record.name }}</a>",
        verbose_name="Agent")
    kind = tables.TemplateColumn('<span title="{{ record.get_kind_display }}">{{ record.kind }}</span>',
                                 verbose_name="Kind", order_by=("kind", "name"))
    host = tables.TemplateColumn(
        '{% if record.host %}<a href="{% url \'fleet:host-detail\' record.host_id %}">{{ record.host.name }}</a>'
        '{% elif record.vm %}VM <a href="{% url \'fleet:vm-detail\' record.vm_id %}">{{ record.vm.name }}</a>'
        '{% else %}<span class="muted">none</span>{% endif %}',
        verbose_name="Host", order_by=("host__name", "name"),
        attrs=tip("The host whose GPUs it reports, or the one VM an in-guest agent reports"))
    vm = tables.Column(empty_values=(), **HIDDEN)
    url = tables.TemplateColumn('{{ record.url|default:"(pushes)" }}', verbose_name="URL",
                                attrs={"td": {"class": "mono small"}})
    enabled = tables.Column(**HIDDEN)
    status = tables.TemplateColumn('<span class="badge {{ record.status_now }}">{{ record.status_now }}</span>',
                                   verbose_name="Status", orderable=False,
                                   attrs=tip("ok: polled recently; stale: not seen lately; error: the last attempt "
                                             "failed; new: never seen; disabled"))
    last_seen = tables.TemplateColumn(
        "{% if record.last_seen %}<time datetime=\"{{ record.last_seen|date:'c' }}\" "
        "title=\"{{ record.last_seen|date:'Y-m-d H:i:s' }} UTC\">{{ record.last_seen|timesince }} ago</time> "
        "<div class=\"muted small\">{{ record.last_seen|date:'Y-m-d H:i:s' }} UTC</div>"
        '{% else %}<span class="muted">never</span>{% endif %}',
        verbose_name="Last seen", attrs={"th": {"title": "Last successful collection"}, "td": {"class": "nowrap"}})
    last_error = tables.TemplateColumn(
        '{% if record.last_error %}<span class="{% if record.error_is_current %}error-text{% else %}muted{% endif %}" '
        'title="{{ record.last_error }}">{{ record.last_error|truncatechars:80 }}</span> '
        "{% if record.last_error_at %}<div class=\"muted small\">{{ record.last_error_at|date:'Y-m-d H:i:s' }} UTC"
        "{% if not record.error_is_current %} (since recovered){% endif %}</div>{% endif %}"
        '{% else %}<span class="muted">none</span>{% endif %}',
        verbose_name="Last error", orderable=False, attrs={"td": {"class": "last-error"}})
    last_error_at_utc = tables.Column(empty_values=(), **HIDDEN)
    consecutive_failures = tables.Column("Failures", order_by=("consecutive_failures", "name"),
                                         attrs=num("Failed attempts in a row"))
    clock_skew_s = tables.TemplateColumn(
        '{% if record.clock_skew_s is None %}<span class="muted">n/a</span>{% else %}'
        "{{ record.clock_skew_s|floatformat:1 }} s{% endif %}",
        verbose_name="Clock skew", order_by=("clock_skew_s", "name"),
        attrs=num("Agent clock minus ours at the last poll, seconds", td={"class": "num nowrap"}))

    export_names = {"last_seen": "last_seen_utc"}

    class Meta(ListTable.Meta):
        order_by = ("name",)

    def value_name(self, record):
        return record.name

    def value_kind(self, record):
        return record.kind

    def value_host(self, record):
        return record.host.name if record.host else None

    def value_vm(self, record):
        return record.vm.name if record.vm else None

    def value_url(self, record):
        return record.url

    def value_status(self, record):
        return record.status_now

    def value_last_seen(self, record):
        return _iso(record.last_seen)

    def value_last_error(self, record):
        return record.last_error

    def value_last_error_at_utc(self, record):
        return _iso(record.last_error_at)

    def value_clock_skew_s(self, record):
        return record.clock_skew_s


# Sizing --------------------------------------------------------------------------------------


class SuggestionTable(ListTable):
    """Every VM's right-sizing suggestion. Its rows are drawn by `sizing/partials/suggestion_row.html`
    (each has an evidence row that opens under it); this class holds the headers, the orderings
    and the export (`figures` set by the page's `decorate`)."""

    vm = tables.Column("VM", accessor="vm__name", order_by=("vm__name",))
    artist = tables.Column("Artist", accessor="vm__artist__name", order_by=("vm__artist__name", "vm__name"))
    host = tables.Column(accessor="vm__host__name", **HIDDEN)
    current_profile = tables.Column("Profile", accessor="current_profile__name", orderable=False,
                                    attrs=tip("Current profile → suggested profile"))
    suggested_profile = tables.Column(accessor="suggested_profile__name", **HIDDEN)
    suggested_vgpus = tables.Column(**HIDDEN)
    action = tables.Column("Advice", order_by=("action_rank", "gpus_delta", "vm__name"))
    frame_buffer = tables.Column("Frame buffer", empty_values=(), orderable=False, exclude_from_export=True,
                                 attrs=tip("p95, peak and mean use over active hours, as % of the current profile"))
    fb_p95_pct = tables.Column(empty_values=(), **HIDDEN)
    fb_peak_pct = tables.Column(empty_values=(), **HIDDEN)
    fb_mean_pct = tables.Column(empty_values=(), **HIDDEN)
    util_gpu_p95_pct = tables.Column("GPU p95", empty_values=(), orderable=False,
                                     attrs=num("95th percentile of GPU utilization over active hours, % of the GPU"))
    enc_util_max_pct = tables.Column("Encoder max", empty_values=(), orderable=False,
                                     attrs=num("Highest hourly encoder utilization, %"))
    fits = tables.Column("Fits", order_by=("fits", "vm__name"), attrs=tip("Where the suggested profile fits now"))
    gpus_delta = tables.Column("GPUs", order_by=("gpus_delta", "vm__name"),
                               attrs=num("GPUs freed (−) or needed (+) fleet-wide if this change alone were applied"))
    reason = tables.Column(**HIDDEN)
    dismissed = tables.Column(**HIDDEN)
    actions = tables.Column("", empty_values=(), orderable=False, exclude_from_export=True, attrs=tip("Actions"))

    class Meta(ListTable.Meta):
        order_by = ("action",)

    def value_action(self, record):
        return record.action

    def value_fits(self, record):
        return record.fits

    def value_fb_p95_pct(self, record):
        return record.figures.fb_p95_pct

    def value_fb_peak_pct(self, record):
        return record.figures.fb_peak_pct

    def value_fb_mean_pct(self, record):
        return record.figures.fb_mean_pct

    def value_util_gpu_p95_pct(self, record):
        return record.figures.util_gpu_p95_pct

    def value_enc_util_max_pct(self, record):
        return record.figures.enc_util_max_pct


# Audit log -----------------------------------------------------------------------------------

_NAMED = ('{% if NAMED %}{% if NAMED.url %}<a href="{{ NAMED.url }}">{{ NAMED.text }}</a>{% else %}{{ NAMED.text }}'
          '{% endif %}{% if NAMED.gone %} <span class="muted">(gone)</span>{% endif %}'
          '{% else %}{{ VALUE|default_if_none:"—" }}{% endif %}')


class AuditEventTable(ListTable):
    """Audit events, newest first, each with its object and its changed fields, ids shown as
    names (`object_named` and the `diff` rows set by `dashboard.audit_log.name_events`). The
    export is the API's (`/api/v1/audit-events/?format=csv`), so this table has none."""

    at = tables.TemplateColumn("{{ record.at|date:'Y-m-d H:i:s' }}", verbose_name="When",
                               attrs={"td": {"class": "nowrap"}})
    actor = tables.TemplateColumn('{{ record.actor_name|default:"system" }}', verbose_name="Who",
                                  order_by=("actor_name", "-at"))
    source = tables.Column("Source", order_by=("source", "-at"))
    action = tables.TemplateColumn("<code>{{ record.action }}</code>", verbose_name="Action",
                                   order_by=("action", "-at"))
    object = tables.TemplateColumn(
        '{% if record.object_named %}<a href="{{ record.object_named.url }}">{{ record.object_repr }}</a>'
        "{% else %}{{ record.object_repr }}{% endif %} "
        '<span class="muted">{{ record.object_type }}'
        '{% if record.object_id %} #{{ record.object_id }}{% endif %}</span>',
        verbose_name="Object", empty_values=(), order_by=("object_type", "object_repr", "-at"))
    changes = tables.TemplateColumn(
        '<table class="audit-diff">{% for row in record.diff %}{% if row.changed %}'
        '<tr class="changed" data-field="{{ row.field }}"><th>{{ row.label }}</th>'
        "<td><del>" + _NAMED.replace("NAMED", "row.before_named").replace("VALUE", "row.before") + "</del></td>"
        "<td><ins>" + _NAMED.replace("NAMED", "row.after_named").replace("VALUE", "row.after") + "</ins></td>"
        "</tr>{% endif %}{% endfor %}</table>"
        "{% if record.comment %}<p>{{ record.comment }}</p>{% endif %}",
        verbose_name="Changes", empty_values=(), orderable=False)

    class Meta(ListTable.Meta):
        order_by = ("-at",)


class OperationTable(ListTable):
    """Operations, newest first: what they change, where, their state and their last error."""

    id = tables.TemplateColumn('<a href="{% url \'hypervisors:operation-detail\' record.pk %}">#{{ record.pk }}</a>',
                               verbose_name="Operation")
    status = tables.TemplateColumn(
        '<span class="badge op-{{ record.status }}">{{ record.get_status_display }}</span>', verbose_name="Status")
    kind = tables.Column(verbose_name="Kind")
    vm = tables.TemplateColumn('<a href="{% url \'fleet:vm-detail\' record.vm_id %}">{{ record.vm.name }}</a>',
                               verbose_name="VM", order_by=("vm__name",))
    host = tables.TemplateColumn(
        '{{ record.host.name }}{% if record.target_host_id != record.host_id %} → {{ record.target_host.name }}'
        '{% endif %}', verbose_name="Host", order_by=("host__name",))
    origin = tables.Column(verbose_name="For", orderable=False)
    progress = tables.TemplateColumn("{{ record.progress }}", verbose_name="Steps", orderable=False)
    created_at = tables.DateTimeColumn(verbose_name="Created", format="Y-m-d H:i")
    error = tables.TemplateColumn('<span class="small">{{ record.error|truncatechars:120 }}</span>',
                                  verbose_name="Error", orderable=False)

    class Meta(ListTable.Meta):
        order_by = ("-created_at",)
        sequence = ("id", "status", "kind", "vm", "host", "origin", "progress", "created_at", "error")


class NotificationChannelTable(ListTable):
    """Notification channels with their filters and the outcome of their last delivery
    (`last_status`, `last_at`, `last_error` from `notify.queries.channels_with_last_delivery`)."""

    name = tables.TemplateColumn('<a href="{% url \'notify:channel-edit\' record.pk %}">{{ record.name }}</a>',
                                 verbose_name="Channel")
    kind = tables.TemplateColumn("{{ record.get_kind_display }}", verbose_name="Kind", order_by=("kind", "name"))
    target = tables.TemplateColumn('{{ record.target|default:"every active admin"|truncatechars:60 }}',
                                   verbose_name="Sends to", orderable=False, attrs={"td": {"class": "mono small"}})
    enabled = tables.BooleanColumn(verbose_name="Enabled")
    min_severity = tables.Column(verbose_name="From severity")
    rules = tables.TemplateColumn('{{ record.rules|join:", "|default:"every rule" }}', verbose_name="Rules",
                                  orderable=False)
    last_status = tables.TemplateColumn(
        '{% if record.last_status %}<span class="badge delivery-{{ record.last_status }}">{{ record.last_status }}'
        "</span> <span class=\"muted small\">{{ record.last_at|date:'Y-m-d H:i' }}</span>"
        '{% if record.last_error %}<div class="small error-text" title="{{ record.last_error }}">'
        "{{ record.last_error|truncatechars:80 }}</div>{% endif %}"
        '{% else %}<span class="muted">nothing sent yet</span>{% endif %}',
        verbose_name="Last delivery", orderable=False)

    class Meta(ListTable.Meta):
        order_by = ("name",)
        sequence = ("name", "kind", "target", "enabled", "min_severity", "rules", "last_status")


class DeliveryTable(ListTable):
    """Deliveries, newest first: which message went to which channel, and how it went."""

    created_at = tables.DateTimeColumn(verbose_name="Created", format="Y-m-d H:i:s")
    channel_name = tables.TemplateColumn(
        '{% if record.channel_id %}<a href="{% url \'notify:channel-edit\' record.channel_id %}">'
        "{{ record.channel_name }}</a>{% else %}{{ record.channel_name }} <span class=\"muted\">(deleted)</span>"
        "{% endif %}", verbose_name="Channel", order_by=("channel_name",))
    severity = tables.Column(verbose_name="Severity")
    event = tables.Column(verbose_name="Event")
    title = tables.TemplateColumn('{% if record.url %}<a href="{{ record.url }}">{{ record.title }}</a>'
                                  "{% else %}{{ record.title }}{% endif %}", verbose_name="Message", orderable=False)
    status = tables.TemplateColumn(
        '<span class="badge delivery-{{ record.status }}">{{ record.get_status_display }}</span>',
        verbose_name="Status")
    attempts = tables.Column(verbose_name="Attempts", attrs=num("Attempts made so far"))
    last_error = tables.TemplateColumn(
        '{% if record.last_error %}<span class="small" title="{{ record.last_error }}">'
        "{{ record.last_error|truncatechars:100 }}</span>{% endif %}"
        "{% if record.next_attempt_at %}<div class=\"muted small\">next try {{ record.next_attempt_at|date:'H:i:s' }}"
        "</div>{% endif %}", verbose_name="Last error", orderable=False)

    class Meta(ListTable.Meta):
        order_by = ("-created_at",)
        sequence = ("created_at", "channel_name", "severity", "event", "title", "status", "attempts", "last_error")

    def value_channel_name(self, record) -> str:
        return record.channel_name

    def value_title(self, record) -> str:
        return record.title

    def value_last_error(self, record) -> str:
        return record.last_error


class AlertTable(ListTable):
    """Alerts, most recently seen first: severity, what, where, whom it touches, since when."""

    severity = tables.TemplateColumn('<span class="badge sev-{{ record.severity }}">{{ record.get_severity_display }}'
                                     '</span>', verbose_name="Severity")
    title = tables.TemplateColumn('<a href="{% url \'alerts:alert\' record.pk %}">{{ record.title }}</a>',
                                  verbose_name="Alert", order_by=("title",))
    state = tables.TemplateColumn('<span class="badge alert-{{ record.state }}">{{ record.get_state_display }}'
                                  '</span>{% if record.silenced %} <span class="badge" title="A silence keeps it '
                                  'quiet">silenced</span>{% endif %}', verbose_name="State")
    rule = tables.Column(accessor="rule__title", verbose_name="Rule", order_by=("rule__kind",))
    host = tables.TemplateColumn('{% if record.host_id %}<a href="{% url \'fleet:host-detail\' record.host_id %}">'
                                 '{{ record.host.name }}</a>{% endif %}', verbose_name="Host",
                                 order_by=("host__name",))
    vms = tables.TemplateColumn("{{ record.vms.all|length }}", verbose_name="VMs", orderable=False,
                                attrs=num("VMs affected"))
    first_seen = tables.DateTimeColumn(verbose_name="Since", format="Y-m-d H:i")
    last_seen = tables.DateTimeColumn(verbose_name="Last seen", format="Y-m-d H:i")

    export_names = {"vms": "vms_affected"}

    class Meta(ListTable.Meta):
        order_by = ("-last_seen",)
        sequence = ("severity", "title", "state", "rule", "host", "vms", "first_seen", "last_seen")

    def value_vms(self, record) -> int:
        return len(record.vms.all())

    def value_title(self, record) -> str:
        return record.title

    def value_state(self, record) -> str:
        return record.state

    def value_host(self, record) -> str:
        return record.host.name if record.host_id else ""

    def value_severity(self, record) -> str:
        return record.severity


class SilenceTable(ListTable):
    """Silences, latest end first: what they match, why, until when."""

    matcher = tables.TemplateColumn(
        '{% if record.alert_id %}alert <a href="{% url \'alerts:alert\' record.alert_id %}">#{{ record.alert_id }}</a>'
        '{% endif %}{% if record.rule_id %} rule {{ record.rule.title }}{% endif %}{% if record.host_id %} host '
        '{{ record.host.name }}{% endif %}{% if record.gpu_id %} GPU {{ record.gpu }}{% endif %}',
        verbose_name="Matches", orderable=False)
    reason = tables.Column(verbose_name="Reason", orderable=False)
    starts_at = tables.DateTimeColumn(verbose_name="From", format="Y-m-d H:i")
    ends_at = tables.DateTimeColumn(verbose_name="Until", format="Y-m-d H:i")
    created_by = tables.Column(accessor="created_by__username", verbose_name="By", default="", orderable=False)
    end = tables.TemplateColumn(
        '{% if record.is_active %}<form method="post" action="{% url \'alerts:silence-end\' record.pk %}">'
        '{% csrf_token %}<button type="submit">End now</button></form>{% else %}<span class="muted">ended</span>'
        '{% endif %}', verbose_name="", orderable=False, exclude_from_export=True)

    class Meta(ListTable.Meta):
        order_by = ("-ends_at",)
        sequence = ("matcher", "reason", "starts_at", "ends_at", "created_by", "end")
