"""HTML pages of the fleet: the overview, lists, detail pages and an artist's workstation.

One module per page family; each view is thin (parse, call `fleet.queries` /
`telemetry.queries`, render). Templates live in templates/fleet/, htmx partials in
templates/fleet/partials/.
"""
