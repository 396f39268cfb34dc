set terminal pngcairo size 1280,520 noenhanced font "Sans,11"
set output "ctr-throughput.png"
set grid
set multiplot layout 1,2 title "synthetic CTR: training throughput vs worker count - small" font "Sans,13"
$d0 << EOD
1 214298 214298
2 142534 71266.8
4 124008 31002
EOD
$d1 << EOD
2 167032 83516
4 90371.4 22592.9
EOD
$d2 << EOD
1 245049 245049
2 332186 166093
4 220434 55108.6
EOD
$d3 << EOD
1 230537 230537
2 171189 85594.5
4 165341 41335.4
EOD
$d4 << EOD
1 236283 236283
2 190793 95396.6
4 164986 41246.6
EOD
set autoscale
unset label 1
set key below horizontal box maxcols 3 Left reverse width 2
set bmargin 7
set title "all workers"
set xlabel "workers"
set ylabel "examples/s, all workers (evaluation excluded)"
set xtics (1, 2, 4)
set xrange [0.5:4.5]
set yrange [0:*]
plot $d0 using 1:2 with linespoints lc rgb "#1f77b4" pt 7 ps 1.0 lw 2 title "sync", \
     $d1 using 1:2 with linespoints lc rgb "#d62728" pt 5 ps 1.0 lw 2 title "sync+backup1", \
     $d2 using 1:2 with linespoints lc rgb "#2ca02c" pt 9 ps 1.0 lw 2 title "async", \
     $d3 using 1:2 with linespoints lc rgb "#ff7f0e" pt 11 ps 1.0 lw 2 title "ssp:2", \
     $d4 using 1:2 with linespoints lc rgb "#9467bd" pt 13 ps 1.0 lw 2 title "ssp:8"
set autoscale
unset label 1
set key below horizontal box maxcols 3 Left reverse width 2
set bmargin 7
set title "per worker (mean)"
set xlabel "workers"
set ylabel "examples/s per worker (evaluation excluded)"
set xtics (1, 2, 4)
set xrange [0.5:4.5]
set yrange [0:*]
plot $d0 using 1:3 with linespoints lc rgb "#1f77b4" pt 7 ps 1.0 lw 2 title "sync", \
     $d1 using 1:3 with linespoints lc rgb "#d62728" pt 5 ps 1.0 lw 2 title "sync+backup1", \
     $d2 using 1:3 with linespoints lc rgb "#2ca02c" pt 9 ps 1.0 lw 2 title "async", \
     $d3 using 1:3 with linespoints lc rgb "#ff7f0e" pt 11 ps 1.0 lw 2 title "ssp:2", \
     $d4 using 1:3 with linespoints lc rgb "#9467bd" pt 13 ps 1.0 lw 2 title "ssp:8"
unset multiplot
