"""Agent.scheduler_write: whether the agent said it holds a write token, so the scheduler page
offers "Apply through the agent" only where the agent would accept it."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("telemetry", "0003_rollup_heatmap_covering_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="scheduler_write",
            field=models.BooleanField(
                default=False,
                editable=False,
                help_text="The agent said in its last accepted report that it holds a write token "
                "(--write-token-file), so the dashboard may apply scheduler policies through it",
            ),
        ),
    ]
