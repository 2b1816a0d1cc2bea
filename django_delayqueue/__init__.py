"""django-delayqueue: a reliable delayed-message queue on Redis for Django."""
