"""The licence picture: what the studio owns per edition, what its running vGPUs use now, the
peak and a forecast from the recorded series (`LicenceUsage`), and who runs unlicensed now."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import Max
from django.utils import timezone

from alerts.gather import licence_counts, vgpu_licences
from alerts.models import Edition, LicencePool, LicenceUsage
from fleet.models import VirtualMachine

FORECAST_DAYS = 30


def forecast(daily_peaks: list[tuple[datetime, int]], ahead_days: int = FORECAST_DAYS) -> float | None:
    """The daily peak `ahead_days` after the last day, by a least-squares line through the daily
    peaks; None with fewer than a week of days to fit (a trend of three points is noise)."""
    if len(daily_peaks) < 7:
        return None
    xs = [(day - daily_peaks[0][0]).total_seconds() / 86400 for day, _ in daily_peaks]
    ys = [float(peak) for _, peak in daily_peaks]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return max(0.0, my + slope * (xs[-1] + ahead_days - mx))


def overview(days: int = 30, now: datetime | None = None) -> dict:
    now = now or timezone.now()
    since = now - timedelta(days=days)
    licences = vgpu_licences()
    counts = licence_counts()
    in_use = {edition: used for edition, (used, _) in counts.items()}
    lapsed = {edition: unlicensed for edition, (_, unlicensed) in counts.items()}
    owned = {pool.edition: pool for pool in LicencePool.objects.all()}
    series: dict[str, list[list]] = defaultdict(list)
    for ts, edition, used, unlicensed in LicenceUsage.objects.filter(ts__gte=since).order_by("ts").values_list(
            "ts", "edition", "in_use", "unlicensed"):
        series[edition].append([ts, used, unlicensed])
    daily: dict[str, list[tuple[datetime, int]]] = defaultdict(list)
    for row in LicenceUsage.objects.filter(ts__gte=since).values("edition", "ts__date").annotate(
            peak=Max("in_use")).order_by("edition", "ts__date"):
        day = datetime.combine(row["ts__date"], datetime.min.time())
        daily[row["edition"]].append((day, row["peak"]))
    editions = []
    for edition, label in Edition.choices:
        points = series.get(edition, [])
        if edition not in owned and not points and not in_use.get(edition) and not lapsed.get(edition):
            continue
        peak_point = max(points, key=lambda p: p[1], default=None)
        pool = owned.get(edition)
        editions.append({
            "edition": edition, "label": label, "owned": pool.owned if pool else None,
            "note": pool.note if pool else "", "in_use": in_use.get(edition, 0),
            "unlicensed": lapsed.get(edition, 0),
            "peak": peak_point[1] if peak_point else None, "peak_at": peak_point[0] if peak_point else None,
            "forecast_peak": _rounded(forecast(daily.get(edition, []))), "forecast_days": FORECAST_DAYS,
            "series": points,
        })
    vms = {vm.pk: vm for vm in VirtualMachine.objects.filter(
        pk__in=[lic.vm_id for lic in licences if lic.license_state == "unlicensed"]).select_related("artist")}
    unlicensed = [{"vm": lic.vm_id, "vm_name": lic.vm_name,
                   "artist": vms[lic.vm_id].artist.name if lic.vm_id in vms and vms[lic.vm_id].artist else None,
                   "host": lic.gpu.host_id, "gpu": lic.gpu.gpu_id, "gpu_label": lic.gpu.label,
                   "type": lic.type_name, "edition": lic.edition}
                  for lic in licences if lic.license_state == "unlicensed"]
    return {"days": days, "editions": editions, "unlicensed": unlicensed}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def chart(overview_data: dict) -> dict:
    """What static/js/licences.js draws: per edition, in-use and unlicensed over time and the pool's size."""
    return {"editions": [
        {"label": e["label"], "owned": e["owned"],
         "x": [point[0].isoformat() for point in e["series"]],
         "in_use": [point[1] for point in e["series"]],
         "unlicensed": [point[2] for point in e["series"]]}
        for e in overview_data["editions"] if e["series"]]}
