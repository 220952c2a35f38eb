// Sampling one token: greedy, top-k and top-p never pick outside their set, and temperature 1
// follows the softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "infer/generate.h"

using namespace memfit;

TEST(Sample, GreedyTopKAndTopP) {
    const float logits[6] = {0.1f, 2.0f, -1.0f, 1.5f, 1.9f, -3.0f};
    std::mt19937_64 rng(1);
    SampleOptions o;
    o.temperature = 0;
    EXPECT_EQ(sample_token(logits, 6, o, rng), 1);
    o.temperature = 1;
    o.top_k = 1;
    EXPECT_EQ(sample_token(logits, 6, o, rng), 1);
    o.top_k = 3;   // {1, 4, 3}
    for (int i = 0; i < 500; ++i) {
        const int t = sample_token(logits, 6, o, rng);
        EXPECT_TRUE(t == 1 || t == 4 || t == 3) << t;
    }
    o.top_k = 0;
    o.top_p = 0.5f;   // p(1) ~ 0.36, p(4) ~ 0.33: the nucleus is {1, 4}
    for (int i = 0; i < 500; ++i) {
        const int t = sample_token(logits, 6, o, rng);
        EXPECT_TRUE(t == 1 || t == 4) << t;
    }
}

TEST(Sample, TemperatureOneFollowsTheSoftmax) {
    const float logits[3] = {0.0f, 1.0f, 2.0f};
    double z = 0;
    for (float l : logits) z += std::exp(double(l));
    std::mt19937_64 rng(7);
    SampleOptions o;
    o.temperature = 1;
    std::map<int, int> n;
    const int draws = 20000;
    for (int i = 0; i < draws; ++i) ++n[sample_token(logits, 3, o, rng)];
    for (int v = 0; v < 3; ++v)
        EXPECT_NEAR(double(n[v]) / draws, std::exp(double(logits[v])) / z, 0.015) << v;
}
