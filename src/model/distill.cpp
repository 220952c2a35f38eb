#include "model/distill.h"

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

void check_teacher(const ModelConfig & teacher, const ModelConfig & student, int T) {
    if (teacher.vocab_size != student.vocab_size)
        throw ConfigError(fmt::format("--teacher has a vocabulary of {} tokens, the student {}: distillation compares "
                                      "their predictions token by token; use a teacher trained with the student's "
                                      "tokenizer",
                                      teacher.vocab_size, student.vocab_size));
    if (T > teacher.max_seq)
        throw ConfigError(fmt::format("seq = {} exceeds the teacher's context of {} positions; lower --seq", T,
                                      teacher.max_seq));
    if (teacher.sliding_window > 0 && T > teacher.sliding_window)
        throw ConfigError(fmt::format("the teacher's sliding window of {} keys is below seq = {}; distilling from a "
                                      "windowed teacher is not supported, lower --seq to {}",
                                      teacher.sliding_window, T, teacher.sliding_window));
}

}  // namespace memfit
