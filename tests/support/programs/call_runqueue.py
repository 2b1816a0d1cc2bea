"""``call_command("runqueue", *argv)`` from a script of its own (the settings come from
``$DJANGO_SETTINGS_MODULE``): a runqueue whose command line does not run ``runqueue``, so its
supervisor cannot start itself again on SIGHUP and goes on forking."""

import sys

import django
from django.core.management import call_command

if __name__ == "__main__":
    django.setup()
    call_command("runqueue", *sys.argv[1:])
