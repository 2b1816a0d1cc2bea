from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Effect",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("queue", models.CharField(max_length=100)),
                ("message_id", models.CharField(max_length=200)),
                ("scheduled_ms", models.BigIntegerField()),
                ("attempt", models.IntegerField()),
            ],
        ),
    ]
