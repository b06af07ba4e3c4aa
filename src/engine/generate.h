/* generate.h — one-shot generation; the API is public (comet/generate.h). */
#ifndef COMET_ENGINE_GENERATE_H
#define COMET_ENGINE_GENERATE_H

#include "backend/backend.h"
#include "comet/generate.h"
#include "engine/sampler.h"

#endif
