// Pipeline parallelism (GPipe, Huang et al. 2019; 1F1B and interleaved 1F1B, Narayanan et al.
// 2019 and 2021): the blocks are
// cut into P stages of consecutive layers, the embedding with the first and the final norm and
// LM head with the last; micro-batches flow forward stage to stage and their gradients flow
// back. A stage's parameters are make_param_layout's restricted to what it runs (a tied GPT-2
// embedding lives on the first and the last stage, and their gradients are summed).
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "model/lora.h"
#include "model/param_layout.h"

namespace memfit {

enum class PipeSchedule { gpipe, one_f_one_b, interleaved };
// "gpipe" | "1f1b" | "interleaved:V" (V >= 2 model chunks per stage, into *virtual_stages);
// ConfigError naming the choices.
PipeSchedule parse_schedule(const std::string & s, int * virtual_stages = nullptr);
const char * schedule_name(PipeSchedule s);

struct PipelineParallel {
    int stages = 1, stage = 0;
    int micro_batches = 1;               // per optimizer step, all in one step program
    PipeSchedule schedule = PipeSchedule::one_f_one_b;
    // Interleaved: each stage holds this many chunks of blocks, chunk j of stage s being virtual
    // stage j P + s of P V; else 1.
    int virtual_stages = 1;
    bool enabled() const { return stages > 1; }
    bool first() const { return stage == 0; }
    bool last() const { return stage == stages - 1; }
};

// Stage s's blocks [begin, end): contiguous ranges balanced by cost (a block's matmul and
// attention FLOPs; the LM head's counted on the last stage), every stage at least one block.
// ConfigError when there are more stages than blocks.
struct StageRange { int begin = 0, end = 0; };
std::vector<StageRange> pipeline_stages(const ModelConfig & cfg, int stages, int seq);

// The stage's parameters (its chunks' blocks), in make_param_layout order with fresh offsets.
ParamLayout stage_layout(const ModelConfig & cfg, const std::vector<StageRange> & chunks, bool first, bool last);
inline ParamLayout stage_layout(const ModelConfig & cfg, StageRange r, bool first, bool last) {
    return stage_layout(cfg, std::vector<StageRange>{r}, first, last);
}
// LoRA on a stage: the adapters (a make_lora_layout) and packed projections (a QuantLayout) of the
// blocks in `chunks`, offsets renumbered.
ParamLayout keep_blocks(const ParamLayout & layout, const std::vector<StageRange> & chunks);
QuantLayout keep_blocks(const QuantLayout & q, const std::vector<StageRange> & chunks);
// ConfigError (one line) unless the model's blocks cover P stages of V chunks each.
void check_pipeline(const ModelConfig & cfg, int P, int V);
// Stage s's chunks: its one range, or (interleaved) virtual stages s, s + P, ... of P V.
std::vector<StageRange> stage_chunks(const ModelConfig & cfg, const PipelineParallel & pp, int seq);
// Whether the stage holds the token embedding twice over the pipeline (GPT-2's tied head on a
// last stage that is not the first): its gradient is summed with the first stage's.
bool holds_tied_copy(const ModelConfig & cfg, bool first, bool last);

// One stage's order of work: forward (fwd) or backward of micro-batch mb through its chunk.
struct PipeAction { bool fwd = true; int mb = 0, chunk = 0; };
// gpipe: every forward, then every backward. 1f1b: min(P - s - 1, m) forwards, then one forward
// and one backward in turn, then the remaining backwards (at most P - s micro-batches in flight).
// interleaved (V chunks, m a multiple of P): forwards go through the chunks P micro-batches at
// a time; a warm-up of 2 (P - s - 1) + (V - 1) P forwards, then one forward and one backward in
// turn (Narayanan et al. 2021).
std::vector<PipeAction> pipeline_schedule(PipeSchedule kind, int stages, int stage, int micro_batches,
                                          int virtual_stages = 1);

// The interleaved schedule's messages, as stage `stage` posts them in its order: in action j a
// forward of virtual stage v = chunk P + stage receives micro-batch mb's input from v - 1 (unless
// v = 0) and sends its output to v + 1 (unless v is the last); a backward receives its output's
// gradient from v + 1 and sends its input's gradient to v - 1. peer: the neighbouring stage; tag:
// pipe_tag's, unique per message of a step.
struct PipeMessage { int action = 0; bool send = false; int peer = 0, tag = 0; };
int pipe_tag(bool gradient, int mb, int v, int stages, int virtual_stages);
std::vector<PipeMessage> interleaved_messages(int stages, int stage, int micro_batches, int virtual_stages);
// Where the stage may complete each of its sends (by the send's index in its messages) without
// waiting on the peer: just after the receive of the first message the peer sends back once it
// has received the send (the peer's receive is then done, whatever the timing), as the index of
// that receive in the stage's messages; -1: at the step's end. A send's buffer then lives while
// the micro-batches in flight do (Megatron's bound), not until the step ends.
std::vector<int> interleaved_send_waits(int stages, int stage, int micro_batches, int virtual_stages);
// The most of the stage's sends not yet complete at once under those waits (each one boundary
// activation or its gradient): what the planner charges.
int interleaved_pending_sends(int stages, int stage, int micro_batches, int virtual_stages);

}  // namespace memfit
