from django.db import migrations, models

# Nullable (None: no key), as 0007's unique_ms: the rows an older process writes during a
# rolling deploy, without this column, must not break its transaction (Django keeps no default
# in the table).


class Migration(migrations.Migration):
    dependencies = [
        ("django_delayqueue", "0009_flow_keys"),
    ]

    operations = [
        migrations.AddField(
            model_name="recurringschedule",
            name="key",
            field=models.CharField(
                blank=True,
                default=None,
                help_text=(
                    "Every tick's flow key, which the queue's key limits count by. Empty: none."
                ),
                max_length=200,
                null=True,
                verbose_name="flow key",
            ),
        ),
    ]
