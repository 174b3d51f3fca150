"""The dashboard's pages, one module per page family. Each view is thin: parse the request
through a form, call the domain apps' queries and services (or the page data builders in
dashboard/details.py and dashboard/overview.py), render. Templates live in templates/<section>/,
htmx partials in templates/<section>/partials/."""
