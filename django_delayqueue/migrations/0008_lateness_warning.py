from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayqueue", "0007_outbox_unique_window"),
    ]

    operations = [
        migrations.AddField(
            model_name="queueconfig",
            name="lateness_warning_ms",
            field=models.PositiveIntegerField(
                blank=True,
                help_text=(
                    "Flag the queue (admin, queuestats, the health probe when asked) when the "
                    "p99 of its handlers' start lateness over the last 5 minutes passes this "
                    "many milliseconds. Empty: no warning."
                ),
                null=True,
            ),
        ),
    ]
