// A paged KV cache (PagedAttention, Kwon et al. 2023): each layer's keys and values live in a
// pool of fixed-size blocks, and each sequence owns a list of blocks (its row of the block
// table), so a sequence reserves its context one block at a time and gives the blocks back when
// it ends, instead of a contiguous region sized for the longest context.
//
// A paged step (infer/decoder.h) runs N token rows of up to S sequences at once: prefill chunks
// and single decode tokens side by side. Every row carries its own sequence and position, read
// from one i32 buffer the host fills before the step (the step's metadata):
//
//   seq[N] | pos[N] | doc_start[N] | table[S * max_blocks] | logit_rows[S]
//
//   seq[i]        the block-table row of token i's sequence; -1: a padding row (no key written,
//                 output zero)
//   pos[i]        token i's position in its sequence; its key and value go to pool row
//                 table[seq][pos / block] * block + pos % block
//   doc_start[i]  i - pos[i]: the embedding and RoPE read positions as doc_start's "t - start"
//                 (backend/kernel_list.h), negative where a row's position passes its index
//   table         S rows of max_blocks block indices (-1: none; a sliding window's freed blocks)
//   logit_rows    the token rows whose logits the step keeps, one per sequence slot (an idle slot
//                 names row 0: its logits are computed and not read)
#pragma once

#include <cstdint>

#include "backend/stochastic_round.h"   // MF_HOST_DEVICE

namespace memfit {

struct PagedKv {
    int block = 0;        // positions per block (0: no paged cache)
    int blocks = 0;       // blocks in each layer's pool
    int seqs = 0;         // S: sequences one step serves (block-table rows)
    int max_blocks = 0;   // block-table columns: a sequence's context in blocks
    int tokens = 0;       // N: the most token rows one step runs (its metadata's size)
    // The pools' rows hold int8 codes: per KV head, hd codes of round(x / s) with s = max |x| / 127,
    // the KV heads' fp32 scales s after the row's codes (paged_row_bytes). Else the compute dtype.
    bool int8 = false;

    MF_HOST_DEVICE bool enabled() const { return block > 0; }
    MF_HOST_DEVICE int64_t pool_rows() const { return int64_t(blocks) * block; }
    // Offsets (in i32 words) of the metadata's parts, and its whole size.
    MF_HOST_DEVICE int64_t seq_at() const { return 0; }
    MF_HOST_DEVICE int64_t pos_at() const { return tokens; }
    MF_HOST_DEVICE int64_t doc_at() const { return 2 * int64_t(tokens); }
    MF_HOST_DEVICE int64_t table_at() const { return 3 * int64_t(tokens); }
    MF_HOST_DEVICE int64_t logit_rows_at() const { return table_at() + int64_t(seqs) * max_blocks; }
    MF_HOST_DEVICE int64_t meta_words() const { return logit_rows_at() + seqs; }
};

// Bytes of one pool row (one position's keys, or values, of one layer) of KV = KVH * hd elements.
MF_HOST_DEVICE inline int64_t paged_row_bytes(const PagedKv & kv, int64_t KVH, int64_t hd, int64_t elem_bytes) {
    return kv.int8 ? KVH * hd + 4 * KVH : KVH * hd * elem_bytes;
}

// The pool row holding position `pos` of the sequence whose block-table row is `row`.
MF_HOST_DEVICE inline int64_t paged_slot(const int32_t * row, int block, int pos) {
    return int64_t(row[pos / block]) * block + pos % block;
}

}  // namespace memfit
