"""A failed rank's cause, as the launcher reports it: `Type: message` of the rank's own error."""

from __future__ import annotations

import functools

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

from fsdp_lab.checkpoint import root_cause


def record_failure(fn):
    """torch elastic's @record for every failure. @record writes the error file the launcher reads a
    failed rank's cause from only for an Exception; a BaseException (DCP's CheckpointException is
    one) would leave elastic's boilerplate ("To enable traceback see ...") as the reported cause."""
    recorded = record(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return recorded(*args, **kwargs)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            ErrorHandler().record_exception(root_cause(e))
            raise

    return wrapper
