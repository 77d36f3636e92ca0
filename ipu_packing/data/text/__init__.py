"""`prepare`'s own room: raw text -> documents (corpus) -> NSP/MLM instances (recipe), orchestrated with
the shared write phase by pipeline. (Named `text`, not `prepare`: `ipu_packing.data.prepare` is the
function.)"""
