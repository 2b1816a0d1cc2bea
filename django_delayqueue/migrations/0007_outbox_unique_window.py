from django.db import migrations, models

# Nullable (None: no window): the rows an older process inserts during a rolling deploy,
# without this column, must not break its transaction (Django keeps no default in the table).


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayqueue", "0006_flow_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxmessage",
            name="unique_ms",
            field=models.BigIntegerField(
                default=None, null=True, verbose_name="uniqueness window (ms)"
            ),
        ),
    ]
