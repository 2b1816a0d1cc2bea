from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayqueue", "0008_lateness_warning"),
    ]

    operations = [
        migrations.AddField(
            model_name="queueconfig",
            name="key_concurrency",
            field=models.PositiveIntegerField(
                blank=True,
                help_text=(
                    "At most this many messages of one flow key (schedule(..., key=...)) run at "
                    "once, across every consumer. Empty: no cap."
                ),
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="queueconfig",
            name="key_rate_limit",
            field=models.CharField(
                blank=True,
                help_text=(
                    'At most this many messages of one flow key start: "1/s", "60/m", with an '
                    'optional burst ("1/s burst 3"). Empty: no limit.'
                ),
                max_length=40,
                null=True,
            ),
        ),
    ]
