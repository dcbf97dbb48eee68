"""The security suite (issue 22): each test is an attack a hostile repository, model or client can
make, run against a real ``dsh`` process (real stdio, the real kernel sandbox, real files), once
per confinement mechanism the machine has. ``DSH_STRESS=1`` (``tox -e stress``) runs the long
variants (more rounds, bigger inputs)."""
