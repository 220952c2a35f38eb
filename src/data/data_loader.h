// Batches of training windows from a token file.
//
// Text (version 1): the file's n tokens are cut into W = (n-1)/T windows of T+1 tokens, window k
// starting at token k*T (consecutive windows share one token: the last target of one is the
// first input of the next).
// Documents (version 2): a document of L tokens is min(L-1, T) (input, target) pairs, its first
// T+1 tokens (longer ones are truncated, as Hugging Face truncates to max_length); a target the
// mask does not train is -100, and a document left without any trained target is dropped. Without
// packing each document is a row of its own, padded (pad_id inputs, -100 targets); with packing
// the documents are placed into rows of T pairs by best fit, longest first (ties: file order),
// each row's rest padded. Each row is a window; doc_start gives every token its document's first
// position in the row (the padding after the last document is a document of its own).
// Epoch e visits all W windows once, in the order of a Fisher-Yates shuffle driven by
// std::mt19937_64(seed + e) (the shuffle and the bounded draws are our own, so the order is the
// same on every platform and standard library). next() takes the next B windows; a batch that
// reaches the end of an epoch continues with the next epoch's order.
//
// The state is (epoch, cursor): cursor is how many windows of the current epoch were used.
// seek(epoch, cursor) restores it exactly, for resuming a run.
//
// Pairs (preference data for DPO, `memfit prepare --format preference`): documents 2k and 2k+1
// are pair k's chosen and rejected sides. Each side is a row of its own, padded as above (never
// packed: DPO compares the two rows' log-probabilities). A pair whose longer side exceeds T+1
// tokens first leaves out the start of its prompt (the tokens before either side's first trained
// target), the same tokens on both sides, as far as that side needs and keeping the prompt's last
// token (TRL's keep_end truncation of the prompt); what still exceeds T+1 is cut at the end, and a
// pair either of whose sides is then left without a trained target is dropped whole. The epoch order shuffles the P
// kept pairs (epoch_order(P, seed, e)) and pair p's windows are 2p (chosen) then 2p+1 (rejected),
// so with an even B every batch holds B/2 whole pairs, each chosen first; the cursor is always even.
#pragma once

#include "data/token_file.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace memfit {

class DataLoader {
public:
    // Maps path (FormatError / IoError as TokenFile). ConfigError when a text file has fewer than
    // T+1 tokens or fewer than B windows (documents: no document with a trained target), or when
    // B or T is not positive; `packing` with a text file is a ConfigError (text is windows of one
    // stream already). A document file with fewer rows than B gives batches that run on into the
    // next epoch's order.
    // `pairs` (preference data): ConfigError for a text file, with `packing`, or for an odd B;
    // FormatError for an odd number of documents; ConfigError when no pair has a trained target
    // on both sides.
    DataLoader(const std::string & path, int B, int T, uint64_t seed, bool packing = false, bool pairs = false);

    // Fills inputs[B*T] and targets[B*T], row b being window b of the batch: inputs = its first T
    // tokens, targets = its last T (inputs shifted by one); and, when given, doc_start[B*T]
    // (text: 0); and, when given, windows[B]: the window each row holds (in [0, num_windows()),
    // the index fill_windows takes: a per-window table, such as DPO's reference log-probabilities,
    // is read with it). FormatError (naming the file and the token position) if a token is >= the
    // file's vocab_size.
    void next(int32_t * inputs, int32_t * targets, int32_t * doc_start = nullptr, uint64_t * windows = nullptr);

    // Windows first .. first+n-1, in that order (not the epoch's), into rows 0 .. n-1 as next()
    // fills them (doc_start may be null); the loader's state is untouched. first + n <= num_windows().
    void fill_windows(size_t first, int n, int32_t * inputs, int32_t * targets, int32_t * doc_start = nullptr) const;

    // Documents: how they were laid out.
    struct DocumentStats {
        uint64_t documents = 0;   // in the file
        uint64_t truncated = 0;   // longer than T+1 tokens: cut to their first T+1
        uint64_t prompt_cut = 0;  // pairs: sides whose prompt's first tokens were left out to fit
        uint64_t dropped = 0;     // no trained target (within the first T+1 tokens); pairs: both
                                  // sides of each pair one of whose sides has none
        uint64_t pairs = 0;       // (input, target) pairs in all rows
        uint64_t trained = 0;     // of those, the trained targets
    };
    bool documents() const { return file_.documents(); }
    bool packing() const { return packing_; }
    bool pairs() const { return pairs_; }           // preference pairs: windows 2p, 2p+1 are one pair
    const DocumentStats & document_stats() const { return stats_; }

    size_t num_windows() const { return num_windows_; }
    uint64_t epoch() const { return epoch_; }                // epoch of the next window
    size_t cursor() const { return cursor_; }                // windows of that epoch already used
    // Continue as if next() had been called until epoch() == epoch and cursor() == cursor.
    // ConfigError if cursor > num_windows() (cursor == num_windows() means the start of epoch+1),
    // or if it is odd with pairs (it would split a pair).
    void seek(uint64_t epoch, size_t cursor);

    int batch_size() const { return B_; }
    int seq_len() const { return T_; }
    uint64_t seed() const { return seed_; }
    const TokenFile & file() const { return file_; }

    // The window order of one epoch (exposed for tests): a permutation of [0, num_windows).
    static std::vector<uint64_t> epoch_order(uint64_t num_windows, uint64_t seed, uint64_t epoch);

private:
    void start_epoch(uint64_t epoch);
    void lay_out_documents(int T);
    std::vector<std::pair<uint64_t, uint64_t>> kept_documents(int T);   // (pairs, document)
    uint64_t prompt_cut(uint64_t d, uint64_t cap) const;
    std::vector<uint64_t> cut_;   // pairs: the prompt tokens each document's row leaves out
    void fill_window(size_t w, int32_t * in, int32_t * tg, int32_t * ds) const;
    int32_t checked(uint64_t i) const;   // token i, FormatError when outside the vocabulary

    TokenFile file_;
    int B_, T_;
    uint64_t seed_;
    size_t num_windows_ = 0;
    uint64_t epoch_ = 0;
    size_t cursor_ = 0;
    std::vector<uint64_t> order_;                            // the current epoch's window order
    bool packing_ = false;
    bool pairs_ = false;
    // Documents: window w holds documents row_docs_[row_at_[w] .. row_at_[w+1]), in that order.
    std::vector<uint64_t> row_docs_, row_at_;
    DocumentStats stats_;
};

}  // namespace memfit
