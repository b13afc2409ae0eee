"""The old path of :mod:`lightrail.studies.stragglar_run` (StragglAR measured for real), kept for code that
imports it: issue 32 gave StragglAR's study one spelling."""

from lightrail.studies.stragglar_run import (  # noqa: F401
    METHODS,
    MethodTime,
    StragglarRun,
    StragglerRun,
    measure_stragglar,
    measure_straggler,
)
