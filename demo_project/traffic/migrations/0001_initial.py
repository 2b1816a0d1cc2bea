import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="SalesReport",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("tick", models.CharField(max_length=100, unique=True)),
                ("due_at", models.DateTimeField()),
                ("written_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("orders_open", models.PositiveIntegerField(default=0)),
                ("orders_paid", models.PositiveIntegerField(default=0)),
                ("orders_closed", models.PositiveIntegerField(default=0)),
                ("sms_sent", models.PositiveIntegerField(default=0)),
            ],
            options={
                "ordering": ["-due_at"],
            },
        ),
    ]
