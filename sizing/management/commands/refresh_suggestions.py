"""`manage.py refresh_suggestions`: recompute the right-sizing suggestions now.

The hourly beat task does this on its own; the command is for a fresh install (`make run` calls
it after back-filling the demo history, so the suggestions page opens full) and for scripts.
"""

from django.core.management.base import BaseCommand, CommandError

from fleet.models import VirtualMachine
from sizing import tasks
from sizing.models import SuggestionAction
from sizing.suggestions import refresh_suggestions


class Command(BaseCommand):
    help = ("Recompute the right-sizing suggestion of every VM holding vGPUs (or of the VMs named) from its "
            "hourly rollups over the window (SIZING_WINDOW_DAYS), here and now or, with --enqueue, on a worker.")

    def add_arguments(self, parser):
        parser.add_argument("--vm", action="append", default=[], metavar="NAME",
                            help="only this VM (repeatable)")
        parser.add_argument("--enqueue", action="store_true", help="send the task to a Celery worker instead")

    def handle(self, *args, **options):
        vm_ids = None
        if options["vm"]:
            found = dict(VirtualMachine.objects.filter(name__in=options["vm"]).values_list("name", "pk"))
            missing = sorted(set(options["vm"]) - set(found))
            if missing:
                raise CommandError(f"no VM named {', '.join(missing)}")
            vm_ids = sorted(found.values())
        if options["enqueue"]:
            tasks.refresh_suggestions.delay(vm_ids)
            self.stdout.write("Sent refresh_suggestions to the workers.")
            return
        counts = refresh_suggestions(vm_ids=vm_ids)
        judged = ", ".join(f"{counts[action]} {SuggestionAction(action).label.lower()}"
                           for action in SuggestionAction.values)
        line = f"Suggestions refreshed: {judged}; {counts['removed']} removed"
        if counts["failed"]:
            line += f"; {counts['failed']} VM(s) could not be judged (see the log)"
        self.stdout.write(line + ".")
