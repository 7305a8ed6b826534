// SPDX-License-Identifier: Apache-2.0
// Stream order of the VMM pool's freed small blocks: batches of shared slots and the marks that
// cover them, and forget_stream() applied to thread caches.
#include "memory/vmm_pool_impl.hpp"

namespace vibespatial::raster::detail::vmm {

Batch* VmmPool::new_batch(CUstream key, MarkRef mark) {
  auto b = std::make_unique<Batch>();
  b->key = key;
  b->mark = std::move(mark);
  b->index = batches_.size();
  batches_.push_back(b.get());
  if (!b->mark) {
    try {
      unmarked_.push_back(b.get());
    } catch (...) {
      batches_.pop_back();
      throw;
    }
  }
  return b.release();
}

Batch* VmmPool::unmarked_batch(CUstream key) {
  for (Batch* b : unmarked_) {
    if (b->key == key) return b;
  }
  return new_batch(key, nullptr);
}

void VmmPool::set_mark(Batch* batch, MarkRef mark) {
  if (!batch->mark) std::erase(unmarked_, batch);
  batch->mark = std::move(mark);
}

void VmmPool::add_shared(Slab* slab, void* ptr, Batch* batch) {
  if (slab->shared.empty()) list_of(slab).push_back(slab);
  slab->shared.push_back(SharedSlot{ptr, batch});
  ++batch->slots;
}

void VmmPool::drop_batch_ref(Batch* batch) noexcept {
  if (--batch->slots != 0 || batch->logged) return;
  if (!batch->mark) std::erase(unmarked_, batch);
  Batch* last = batches_.back();
  last->index = batch->index;
  batches_[batch->index] = last;
  batches_.pop_back();
  delete batch;
}

void VmmPool::mark_pending(CUstream stream, CUstream key) noexcept {
  for (Batch* b : unmarked_) {
    if (b->key != key) continue;
    try {
      // Recorded now, the mark covers everything queued on the stream, the frees included (§3.7).
      set_mark(b, marks_.record(stream, key));
    } catch (...) {
      // No mark: the blocks stay reusable on their own stream, and elsewhere after trim().
    }
    return;
  }
}

bool VmmPool::batch_ready_for(Batch* batch, CUstream key) {
  if (batch->key == key) return true;
  return batch_idle(batch);
}

bool VmmPool::batch_idle(Batch* batch) {
  if (!batch->mark) {
    if (batch->key != nullptr) return false;  // no mark yet; only the freeing stream may use it
    set_mark(batch, marks_.record(nullptr, nullptr));  // the legacy stream is always alive
  }
  return marks_.completed(batch->mark);
}

void VmmPool::settle_unmarked() {
  if (unmarked_.empty()) return;
  const DriverApi& api = driver();
  bool other = false;
  for (Batch* b : std::vector<Batch*>(unmarked_)) {
    if (b->key == nullptr) {
      set_mark(b, marks_.record(nullptr, nullptr));
    } else {
      other = true;
    }
  }
  if (!other) return;
  // Their streams may be gone: only a wait for the whole context covers them (§3.7).
  // A sticky error ends all of the context's work as well.
  if (const CUresult r = api.cuCtxSynchronize(); r != CUDA_SUCCESS && !is_sticky_error(r)) {
    throw_cuda_error(r, "cuCtxSynchronize", __FILE__, __LINE__);
  }
  auto done = std::make_shared<StreamMark>(StreamMark{forgotten_stream(), nullptr, true});
  for (Batch* b : std::vector<Batch*>(unmarked_)) set_mark(b, done);
}

void VmmPool::sync_forgotten(ThreadCache& cache) noexcept {
  const std::uint64_t now = forget_epoch_.value.load(std::memory_order_relaxed);
  if (cache.forget_seen == now) return;
  for (const ForgetEntry& f : forget_log_) {
    if (f.epoch <= cache.forget_seen) continue;
    for (int c = 0; c < kMaxSizeClasses; ++c) {
      Bin& bin = cache.bins[static_cast<std::size_t>(c)];
      int kept = 0;
      for (int i = 0; i < bin.count; ++i) {
        const CacheEntry& e = bin.entries[static_cast<std::size_t>(i)];
        if (key_in(cache, e.stream) != f.key) {
          bin.entries[static_cast<std::size_t>(kept++)] = e;
          continue;
        }
        add_shared(e.slab, e.ptr, f.batch);
        if (--e.slab->used == 0 && !e.slab->bump_owned && e.slab->owner != nullptr) {
          set_owner(e.slab, nullptr);
        }
      }
      bin.count = kept;
    }
  }
  cache.forget_seen = now;
  prune_forget_log();
}

void VmmPool::prune_forget_log() noexcept {
  if (forget_log_.empty()) return;
  std::uint64_t oldest = forget_epoch_.value.load(std::memory_order_relaxed);
  for (const ThreadCache* c : caches_) oldest = std::min(oldest, c->forget_seen);
  auto end = std::find_if(forget_log_.begin(), forget_log_.end(),
                          [&](const ForgetEntry& f) { return f.epoch > oldest; });
  for (auto it = forget_log_.begin(); it != end; ++it) {
    Batch* b = it->batch;
    b->logged = false;
    if (b->slots == 0) {
      ++b->slots;
      drop_batch_ref(b);  // deletes it
    }
  }
  forget_log_.erase(forget_log_.begin(), end);
}

}  // namespace vibespatial::raster::detail::vmm
