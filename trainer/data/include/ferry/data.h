// ferry/data.h — the data layer of ferry-trainer, in one include.
//
//   ferry/data/fashion_mnist.h  gzipped IDX reader and the Fashion-MNIST image dataset
//   ferry/data/ctr_batch.h      CtrBatch, the example layout the click-through model consumes
//   ferry/data/criteo.h         streaming reader of Criteo display-ads TSV (plain or gzipped)
//   ferry/data/synthetic_ctr.h  click-through generator with a planted logistic model
//   ferry/data/shard.h          which examples each worker reads, per epoch
//   ferry/data/metrics.h        AUC, log-loss, accuracy; mergeable accumulators
#pragma once

#include "ferry/data/criteo.h"
#include "ferry/data/ctr_batch.h"
#include "ferry/data/fashion_mnist.h"
#include "ferry/data/metrics.h"
#include "ferry/data/shard.h"
#include "ferry/data/synthetic_ctr.h"
