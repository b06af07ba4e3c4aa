/* clock.h — monotonic wall time, for durations (timings, stats, timeouts). */
#ifndef COMET_CORE_CLOCK_H
#define COMET_CORE_CLOCK_H

/* Seconds on CLOCK_MONOTONIC from an arbitrary origin: only differences mean anything. */
double comet_now_s(void);

#endif
