"""A minimal Django project for the end-to-end row: a view schedules, ``runqueue`` delivers."""
