from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayqueue", "0006_flow_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxmessage",
            name="unique_ms",
            field=models.BigIntegerField(default=0, verbose_name="uniqueness window (ms)"),
        ),
    ]
