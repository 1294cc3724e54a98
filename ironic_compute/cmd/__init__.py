import warnings

# futurist imports eventlet when it is installed (oslo.service depends on
# it), and eventlet warns at import although the threading backend never
# uses it: keep that warning out of every command's output.
warnings.filterwarnings('ignore', message=r'\s*Eventlet is deprecated')
