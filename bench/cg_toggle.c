/* Callgrind client requests for bench/tpbuf_segment_ab.py (built with gcc on first use): collect only between
   toggles (valgrind --collect-atstart=no). */
#include <valgrind/callgrind.h>
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
