"""The PySpark pipeline: bulk scheduling from datasets, and reports over the delivery journal.

Optional (``pip install django-delayqueue[spark]``, plus Java 17+). Nothing here imports
Django: executors get a Redis URL, a key prefix, a queue name and plain setting values.
Import the submodules (``session``, ``transforms``, ``bulk``, ``journal``, ``report``)
directly; this package imports nothing so that ``import django_delayqueue.spark`` is cheap.
"""
