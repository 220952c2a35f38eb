#include "plan/distill_plan.h"

namespace memfit {

std::shared_ptr<const DistillPlan> make_distill_plan(const RunConfig & run, const DistillOptions & opts) {
    if (!opts.enabled()) return nullptr;
    auto p = std::make_shared<DistillPlan>();
    p->config = run.distill;
    p->opts = opts;
    const QuantLayout q = opts.quantized() ? make_quant_layout(*opts.teacher, opts.format()) : QuantLayout{};
    p->dense_params = int64_t(dense_layout(*opts.teacher, q).total);
    p->packed_bytes = q.bytes;
    return p;
}

}  // namespace memfit
