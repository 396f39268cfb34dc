"""Reading ahead: the next batch's embedding rows travel while the current step computes.

    for batch in ferry.torch.Prefetcher(loader, ebc, lambda b: features_of(b)):
        pooled = ebc(features_of(batch))    # takes the rows pulled ahead
        ...

Prefetcher(batches, collection, features) iterates `batches`; before it hands out batch k it
has fetched batch k + 1 and started the pull of its rows (collection.prefetch(features(batch
k + 1))), so that pull travels during step k. The forward of batch k + 1 takes those rows when
its features have the same distinct ids per table (it compares them); otherwise it pulls as
usual. Sync tables stay exact (the servers answer the early pull once the step before has
closed, so it reads what a pull in its place would); async and ssp tables read rows without
this worker's last update, one step of staleness, as ferry-trainer's --pipeline prefetch.
"""


class Prefetcher:
    def __init__(self, batches, collection, features):
        self._batches = batches
        self._collection = collection
        self._features = features

    def _read_ahead(self, batch):
        # A batch whose features are refused (TypeError, ValueError) is not read ahead: its own
        # forward raises the same error, at its own step, not while the batch before is handed out.
        try:
            self._collection.prefetch(self._features(batch))
        except (TypeError, ValueError):
            pass

    def __iter__(self):
        it = iter(self._batches)
        try:
            nxt = next(it)
        except StopIteration:
            return
        self._read_ahead(nxt)
        while True:
            cur = nxt
            try:
                nxt = next(it)
            except StopIteration:
                yield cur
                return
            self._read_ahead(nxt)
            yield cur
