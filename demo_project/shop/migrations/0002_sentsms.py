import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("shop", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="SentSms",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("phone", models.CharField(max_length=32)),
                ("text", models.TextField()),
                ("kind", models.CharField(blank=True, max_length=32)),
                ("sent_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "store",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="sms",
                        to="shop.store",
                    ),
                ),
            ],
            options={
                "verbose_name": "sent SMS",
                "verbose_name_plural": "sent SMS",
                "ordering": ["-sent_at", "-id"],
            },
        ),
    ]
