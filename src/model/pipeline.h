// Pipeline parallelism (GPipe, Huang et al. 2019; 1F1B, Narayanan et al. 2019): the blocks are
// cut into P stages of consecutive layers, the embedding with the first and the final norm and
// LM head with the last; micro-batches flow forward stage to stage and their gradients flow
// back. A stage's parameters are make_param_layout's restricted to what it runs (a tied GPT-2
// embedding lives on the first and the last stage, and their gradients are summed).
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "model/param_layout.h"

namespace memfit {

enum class PipeSchedule { gpipe, one_f_one_b };
// "gpipe" | "1f1b"; ConfigError naming the choices (interleaved:V is not implemented).
PipeSchedule parse_schedule(const std::string & s);
const char * schedule_name(PipeSchedule s);

struct PipelineParallel {
    int stages = 1, stage = 0;
    int micro_batches = 1;               // per optimizer step, all in one step program
    PipeSchedule schedule = PipeSchedule::one_f_one_b;
    bool enabled() const { return stages > 1; }
    bool first() const { return stage == 0; }
    bool last() const { return stage == stages - 1; }
};

// Stage s's blocks [begin, end): contiguous ranges balanced by cost (a block's matmul and
// attention FLOPs; the LM head's counted on the last stage), every stage at least one block.
// ConfigError when there are more stages than blocks.
struct StageRange { int begin = 0, end = 0; };
std::vector<StageRange> pipeline_stages(const ModelConfig & cfg, int stages, int seq);

// The stage's parameters, in make_param_layout order with fresh offsets.
ParamLayout stage_layout(const ModelConfig & cfg, StageRange r, bool first, bool last);
// Whether the stage holds the token embedding twice over the pipeline (GPT-2's tied head on a
// last stage that is not the first): its gradient is summed with the first stage's.
bool holds_tied_copy(const ModelConfig & cfg, bool first, bool last);

// One stage's order of work: forward (fwd) or backward of micro-batch mb.
struct PipeAction { bool fwd = true; int mb = 0; };
// gpipe: every forward, then every backward. 1f1b: min(P - s - 1, m) forwards, then one forward
// and one backward in turn, then the remaining backwards (at most P - s micro-batches in flight).
std::vector<PipeAction> pipeline_schedule(PipeSchedule kind, int stages, int stage, int micro_batches);

}  // namespace memfit
