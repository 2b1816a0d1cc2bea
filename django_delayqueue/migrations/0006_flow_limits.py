from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayqueue", "0005_time_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="queueconfig",
            name="rate_limit",
            field=models.CharField(
                blank=True,
                help_text=(
                    'At most this many messages start, across every consumer: "20/s", '
                    '"1200/m", "100/h", with an optional burst ("20/s burst 5"). Empty: no limit.'
                ),
                max_length=40,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="queueconfig",
            name="max_in_flight",
            field=models.PositiveIntegerField(
                blank=True,
                help_text=(
                    "At most this many messages of the queue run at once, across every consumer "
                    "(whatever their concurrency). Empty: no cap."
                ),
                null=True,
            ),
        ),
    ]
