"""What a field kind of another package takes from h5forge beside the kinds' contract
(docs/extending.md): ``SampleRef``, the sample its ``decode`` is given, and ``Reject``, which it raises
for an input it refuses. Both are defined in the internal ``h5forge._samples``."""

from h5forge._samples import Reject, SampleRef

__all__ = ["Reject", "SampleRef"]
