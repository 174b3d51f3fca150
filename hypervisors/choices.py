from django.db.models import TextChoices


class OperationStatus(TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"  # and could not be rolled back whole: the error says what is left
    ROLLED_BACK = "rolled_back", "Rolled back"


class OperationKind(TextChoices):
    RESIZE = "resize", "Resize"  # an approved resize request: new vGPUs for one VM
    MOVE = "move", "Move"  # an optimizer plan's move: the VM's vGPUs to other GPUs, perhaps another host


class StepKind(TextChoices):
    NOTIFY = "notify", "Notify the artist"
    SHUTDOWN = "shutdown", "Shut down"
    REMOVE_VGPU = "remove_vgpu", "Remove the old vGPU"
    CREATE_VGPU = "create_vgpu", "Create the new vGPU"
    REDEFINE = "redefine", "Redefine the VM"
    MOVE_DOMAIN = "move_domain", "Move the VM to its new host"
    START = "start", "Start"
    VERIFY = "verify", "Verify"


class StepStatus(TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    UNDONE = "undone", "Undone"  # rolled back
    SKIPPED = "skipped", "Skipped"  # nothing to do (e.g. the VM was off already)
