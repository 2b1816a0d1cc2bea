"""``runqueue --processes N``: consumer processes under one supervising process.

The supervisor (:mod:`.loop`) forks its children after Django is set up (:mod:`.starting`
starts each one, which runs :mod:`.child`), owns
the signals, replaces a child that dies (with :mod:`.backoff`), recycles one that asks
(:mod:`.memory` says when) and settles the handlers a child could not stop once it is gone.
After a SIGHUP it starts its children as fresh interpreters instead (:mod:`.fresh`), which
load the code on disk: a deploy.
Parent and child speak over a pipe (:mod:`.protocol`). Nothing is imported here, so that a
child or a test can import one module without the others.
"""
