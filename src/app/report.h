// Gathers a ReportData from an engine after a recorded training step: plan vs measured bytes,
// the buffers live at the peak, the largest buffers, and hints computed by re-planning.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "report/report_data.h"
#include "train/engine.h"

namespace memfit {

// `timeline` holds one executed training step of `engine`.
ReportData build_report(const Engine & engine, const Timeline & timeline, const std::string & title,
                        const nlohmann::json & config, uint64_t budget);

// The report of a step that failed out of memory: `timeline` ends at the op that failed
// (Timeline::failed_op); the report's peak is that op, its buffers those the plan has live there.
ReportData build_failure_report(const Engine & engine, const Timeline & timeline, const std::string & title,
                                const nlohmann::json & config, uint64_t budget, const std::string & failure);

// The report of a plan refused before it ran (it does not fit the budget, or the device could
// not reserve it): the plan's own per-op bytes of the training step, up to the first op whose
// live bytes pass the budget (else the plan's peak), and the buffers live there.
ReportData build_refused_plan_report(const StepPlans & plans, const std::string & title, const nlohmann::json & config,
                                     uint64_t budget, const std::string & failure);

}  // namespace memfit
