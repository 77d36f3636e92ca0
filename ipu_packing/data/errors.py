"""The one exception type of the data package.

Every problem caused by the user's input (a missing corpus, bad UTF-8, a broken vocabulary, a corrupt
shard or manifest, an output directory that already holds something) raises `DataError` with a one-line
message naming the file, the shard or the field. The command line prints that line and exits with
status 2; applications can catch `DataError` to do the same. Anything else is a bug and keeps its
traceback.
"""


from ..errors import UserError


class DataError(UserError):
    """A user-facing data problem; str(error) is a single line naming its cause."""
